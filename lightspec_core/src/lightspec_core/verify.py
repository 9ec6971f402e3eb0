"""The standard verifier: greedy matching or lossless rejection sampling, for chains and trees.

Greedy: walk each row's draft while its tokens equal the target's argmax, reading the
target's logits through ``TargetOutput.argmax_at`` only as far as the walk goes (the lm_head
over a wide, mostly rejected draft is most of a verify on a small target).  Sampling:
``lightspec_kernels.chain_verify`` (chains) or ``tree_verify`` (SpecInfer's recursive
rejection over siblings, trees) on the *warped* target distribution and the drafter's warped
one.  The random numbers come from each request's own generator, so a seeded request is
reproducible whatever else shares its batch.
"""

from __future__ import annotations

import torch
from lightspec_kernels import chain_verify, tree_verify

from .hookspecs import hookimpl
from .interfaces import DraftProposal, SparseProbs, StepContext, VerifyResult
from .runner import TargetOutput
from .sampling import argmax_last, exponential_noise, row_uniforms, sample_inverse_cdf, warped_probs


class StandardVerifier:
    """Greedy: keep drafts while they equal the target's argmax.  Sampling: accept with
    min(1, p/q), resample from norm(max(p - q, 0)) on rejection, bonus token when all pass;
    over a tree's siblings, SpecInfer's recursive rejection."""

    name = "standard"

    @hookimpl
    def lightspec_verify(self, ctx: StepContext, proposal: DraftProposal, output: TargetOutput) -> VerifyResult:
        if ctx.sampling.greedy:
            if proposal.parents is None:
                return VerifyResult(*greedy_chain(proposal.node_rows(), output))
            return greedy_tree(proposal.node_rows(), proposal.parent_rows(), output)
        return verify_sampled(ctx, proposal, output)


def greedy_chain(drafts: list[list[int]], output: TargetOutput, first: int = 3, step: int = 4
                 ) -> tuple[list[int], list[list[int]]]:
    """Greedy chain verification from a ``TargetOutput`` of slots ``[B, K+1]``: keep each row's
    draft while it equals the target's argmax, then the target's own token.  The argmax is
    read ``first`` slots at a time, then ``step`` more while some row still accepts, and in
    each row only up to its own draft's end (slot ``len(draft)`` is the bonus).  Returns
    (accepted [B], emitted [B][accepted + 1]) as Python lists."""
    B, Q = output.batch, output.slots
    accepted = [0] * B
    emitted: list[list[int] | None] = [None] * B
    j0, size = 0, first
    while j0 < Q and any(e is None for e in emitted):
        j1 = min(Q, j0 + size)
        spans = [(b, j0, min(j1, len(drafts[b]) + 1)) for b in range(B) if emitted[b] is None]
        top = output.argmax_at([b * Q + j for b, a, e in spans for j in range(a, e)])
        at = 0
        for b, a, e in spans:
            row, at = top[at : at + e - a], at + e - a
            draft = drafts[b]
            for j in range(a, e):
                t = row[j - a]
                if j < len(draft) and draft[j] == t:
                    accepted[b] = j + 1
                    continue
                emitted[b] = draft[:j] + [t]
                break
        j0, size = j1, step
    return accepted, emitted


def greedy_tree(nodes: list[list[int]], parents: list[list[int]], output: TargetOutput) -> VerifyResult:
    """Greedy tree verification: from each row's last token (slot 0), move to the first child
    (lowest node index) whose token is the target's argmax at the current node, until none is;
    that argmax is the bonus token.  One ``argmax_at`` per depth, over the rows still walking."""
    B, Q = output.batch, output.slots
    children = [[[] for _ in range(len(n) + 1)] for n in nodes]  # per row, per slot: child node indices
    for b, par in enumerate(parents):
        for i, p in enumerate(par):
            children[b][p + 1].append(i)
    cur = [0] * B  # current slot per row
    paths: list[list[int]] = [[] for _ in range(B)]
    emitted: list[list[int] | None] = [None] * B
    while any(e is None for e in emitted):
        walking = [b for b in range(B) if emitted[b] is None]
        top = output.argmax_at([b * Q + cur[b] for b in walking])
        for b, t in zip(walking, top):
            nxt = next((i for i in children[b][cur[b]] if nodes[b][i] == t), None)
            if nxt is None:
                emitted[b] = [nodes[b][i] for i in paths[b]] + [t]
            else:
                paths[b].append(nxt)
                cur[b] = nxt + 1
    return VerifyResult([len(p) for p in paths], emitted, paths)


def dense_probs(probs: torch.Tensor | SparseProbs | None, vocab: int) -> torch.Tensor | None:
    """A proposal's draft probabilities as ``[B, N, V]`` (None stays None: one-hot drafts)."""
    if probs is None or isinstance(probs, torch.Tensor):
        return probs
    return probs.dense(vocab)


def verify_sampled(ctx: StepContext, proposal: DraftProposal, output: TargetOutput) -> VerifyResult:
    """Lossless rejection sampling against the warped target distribution (chains and trees)."""
    logits = output.logits  # [B, N+1, V]
    if logits.is_cuda and logits.dtype != torch.float32:
        logits = logits.float()
    p = warped_probs(logits, ctx.sampling)
    B, N = proposal.tokens.shape
    V = p.shape[-1]
    q = dense_probs(proposal.probs, V)
    first, uniforms, exps = random_inputs(ctx.generators, N + (proposal.parents is not None), V, p.device)
    if proposal.parents is None:
        accepted, emitted = chain_verify(proposal.tokens, proposal.lengths, p, q, uniforms, exps)
        result = VerifyResult(accepted, emitted)
    else:
        # a row whose tree is a chain is verified as a chain, with the uniforms a chain
        # proposal draws (a prefix of these): a seeded row's text then does not depend on
        # whether other rows of its batch drafted trees
        chain = _chain_rows(proposal)
        result = None if bool(chain.all()) else _tree_sampled(proposal, p, q, uniforms, exps)
        if result is None or bool(chain.any()):
            acc_c, emit_c = chain_verify(proposal.tokens, proposal.lengths, p, q, uniforms[:, :N], exps)
            nodes = torch.arange(N, device=acc_c.device)
            path_c = torch.where(nodes[None, :] < acc_c[:, None], nodes[None, :], -1)
            result = VerifyResult(acc_c, emit_c, path_c) if result is None else VerifyResult(
                torch.where(chain, acc_c, result.accepted), torch.where(chain[:, None], emit_c, result.emitted),
                torch.where(chain[:, None], path_c, result.path))
        emitted = result.emitted
    # a row without a draft takes the token a plain step would sample (sample_next), from
    # the same first random number: its output does not depend on other rows' drafts
    plain = (proposal.lengths == 0).nonzero().flatten()
    if plain.numel():
        emitted[plain, 0] = sample_inverse_cdf(p[plain, 0], first[plain.to(first.device)]).to(emitted.dtype)
    return result


def _chain_rows(proposal: DraftProposal) -> torch.Tensor:
    """``[B]`` bool: the rows whose tree proposal is a chain (node i's parent is i - 1)."""
    N = proposal.tokens.shape[1]
    nodes = torch.arange(N, device=proposal.parents.device)
    real = nodes[None, :] < proposal.lengths[:, None].to(nodes.device)
    return ((proposal.parents == nodes[None, :] - 1) | ~real).all(dim=1)


def _tree_sampled(proposal: DraftProposal, p: torch.Tensor, q: torch.Tensor | None, uniforms: torch.Tensor,
                  exps: torch.Tensor) -> VerifyResult:
    """``tree_verify`` in the kernels' convention: slot 0 the root, slot 1 + i node i, and the
    draft distribution stored at each parent (the one its children were drawn from)."""
    B, N = proposal.tokens.shape
    dev = p.device
    real = torch.arange(N, device=dev)[None, :] < proposal.lengths[:, None]
    tokens = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=dev), proposal.tokens], 1)
    parents = torch.cat([torch.full((B, 1), -1, dtype=torch.long, device=dev),
                         torch.where(real, proposal.parents + 1, -1)], 1)
    q_parent = None
    if q is not None:  # node i's row goes to its parent's slot; padding to a spare slot dropped after
        q_parent = torch.zeros(B, N + 2, q.shape[-1], dtype=q.dtype, device=dev)
        slot = torch.where(real, proposal.parents + 1, N + 1)
        q_parent.scatter_(1, slot[:, :, None].expand(B, N, q.shape[-1]), q)
        q_parent = q_parent[:, : N + 1]
    res = tree_verify(tokens, parents, p, q_parent, uniforms, exps)
    path = torch.where(res.path >= 0, res.path - 1, -1)  # node indices
    emitted = torch.full((B, N + 1), -1, dtype=torch.long, device=dev)
    node_tokens = proposal.tokens.gather(1, path.clamp(min=0))
    steps = torch.arange(N, device=dev)[None, :] < res.path_len[:, None]
    emitted[:, :N] = torch.where(steps, node_tokens, -1)
    emitted.scatter_(1, res.path_len[:, None], res.bonus[:, None])
    return VerifyResult(res.path_len, emitted, path)


def random_inputs(generators: list[torch.Generator], k: int, vocab: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row random numbers for one verification: the plain step's uniform ``[B]``
    (float64), uniforms ``[B, k]`` and Exp(1) noise ``[B, V]``.

    The plain step's uniform is drawn first, so a row that drafts nothing samples exactly
    what ``sample_next`` would sample: its token does not depend on other rows' drafts."""
    first = row_uniforms(generators, device)
    exps = exponential_noise(generators, vocab, device)
    uniforms = torch.stack([torch.rand(k, generator=g, device=device) for g in generators])
    return first, uniforms, exps


def sample_next(logits: torch.Tensor, sampling, generators) -> torch.Tensor:
    """One plain decoding step from ``logits [B, V]`` → tokens [B]."""
    if sampling.greedy:
        return argmax_last(logits)
    p = warped_probs(logits, sampling)
    return sample_inverse_cdf(p, row_uniforms(generators, p.device))


def verify_chain(ctx: StepContext, proposal: DraftProposal, logits: torch.Tensor) -> VerifyResult:
    """The standard verifier on a chain proposal and full logits ``[B, K+1, V]`` (tests and
    tools that have logits rather than a ``TargetOutput``); the result as tensors."""
    B, Q = logits.shape[0], logits.shape[1]
    res = StandardVerifier().lightspec_verify(ctx=ctx, proposal=proposal, output=TargetOutput(B, Q, None, logits, {}))
    if isinstance(res.accepted, torch.Tensor):
        return res
    emitted = [e + [-1] * (Q - len(e)) for e in res.emitted]
    return VerifyResult(torch.tensor(res.accepted, dtype=torch.long, device=logits.device),
                        torch.tensor(emitted, dtype=torch.long, device=logits.device).view(B, Q))

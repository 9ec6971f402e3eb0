"""The standard chain verifier: greedy matching or lossless rejection sampling.

Both run through ``lightspec_kernels.chain_verify`` (Triton on CUDA, PyTorch elsewhere).
Sampling compares the *warped* target distribution with the drafter's warped one; the
random numbers come from each request's own generator, so a seeded request is
reproducible whatever else shares its batch.
"""

from __future__ import annotations

from typing import Callable

import torch
from lightspec_kernels import chain_verify

from .hookspecs import hookimpl
from .interfaces import DraftProposal, StepContext, VerifyResult
from .sampling import argmax_last, exponential_noise, row_uniforms, sample_inverse_cdf, warped_probs


class StandardVerifier:
    """Greedy: keep drafts while they equal the target's argmax.  Sampling: accept with
    min(1, p/q), resample from norm(max(p - q, 0)) on rejection, bonus token when all pass."""

    name = "standard"

    @hookimpl
    def lightspec_verify(self, ctx: StepContext, proposal: DraftProposal, logits: torch.Tensor) -> VerifyResult:
        return verify_chain(ctx, proposal, logits)


def verify_chain(ctx: StepContext, proposal: DraftProposal, logits: torch.Tensor) -> VerifyResult:
    """``logits [B, K+1, V]`` → VerifyResult."""
    if ctx.sampling.greedy and logits.device.type == "cpu":
        return greedy_cpu(proposal.tokens, proposal.lengths, logits)
    if ctx.sampling.greedy:
        if logits.is_cuda and logits.dtype != torch.float32:
            # Measured on an H200: the compiled greedy Triton path accepted no draft at all with
            # bf16 logits (0% vs 73% in fp32; the interpreter agrees with the reference), so the
            # kernel gets fp32 until that is fixed. See kernels/README.md, "Known issues".
            logits = logits.float()
        accepted, emitted = chain_verify(proposal.tokens, proposal.lengths, logits)
        return VerifyResult(accepted, emitted)
    p = warped_probs(logits, ctx.sampling)
    B, K = proposal.tokens.shape
    first, uniforms, exps = random_inputs(ctx.generators, K, p.shape[-1], p.device)
    accepted, emitted = chain_verify(proposal.tokens, proposal.lengths, p, proposal.probs, uniforms, exps)
    # a row without a draft takes the token a plain step would sample (sample_next), from
    # the same first random number: its output does not depend on other rows' drafts
    plain = (proposal.lengths == 0).nonzero().flatten()
    if plain.numel():
        emitted[plain, 0] = sample_inverse_cdf(p[plain, 0], first[plain.to(first.device)]).to(emitted.dtype)
    return VerifyResult(accepted, emitted)


def greedy_cpu(tokens: torch.Tensor, lengths: torch.Tensor, logits: torch.Tensor) -> VerifyResult:
    """Greedy chain verification on the CPU: ``chain_verify``'s greedy semantics (keep
    drafts while they equal the target's argmax, then the target's token) in one argmax
    and a few list operations.  The reference's ten tensor ops cost ~0.1 ms a step, 3% of
    the zoo target's step with the CPU kernels.  ``tokens [B, K]``, ``lengths [B]``,
    ``logits [B, K+1, V]``."""
    B, K = tokens.shape
    target = argmax_last(logits).tolist()  # [B][K+1]; first maximum, as torch.argmax
    accepted, emitted = [], []
    for t, d, n in zip(target, tokens.tolist(), lengths.tolist()):
        a = 0
        while a < n and d[a] == t[a]:
            a += 1
        accepted.append(a)
        emitted.append(d[:a] + [t[a]] + [-1] * (K - a))
    dev = tokens.device
    return VerifyResult(torch.tensor(accepted, dtype=torch.long, device=dev),
                        torch.tensor(emitted, dtype=torch.long, device=dev).view(B, K + 1))


def greedy_cpu_lazy(tokens: torch.Tensor | list[list[int]], lengths: torch.Tensor | list[int], hidden: torch.Tensor,
                    head: Callable[[torch.Tensor], torch.Tensor], first: int = 3, step: int = 4,
                    as_lists: bool = False, head_argmax: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    ) -> VerifyResult | tuple[list[int], list[list[int]]]:
    """``greedy_cpu`` from the target's final hidden states ``hidden [B, K+1, H]``, applying
    its lm_head ``head`` (``[B, n, H]`` → ``[B, n, V]``) only to the positions the walk
    reaches: ``first`` positions, then ``step`` more at a time while some row is still
    accepting, and in each row only up to its own draft's end.  A wide n-gram draft is
    mostly rejected early, and the lm_head over 17 positions cost the zoo target ~1 ms of
    a ~3 ms verify; in a batch where a few rows draft, the others need one position each.
    Each position's logits are the same numbers a full pass gives (LightSpec's CPU products
    compute every row on its own), so the result is ``greedy_cpu``'s.  ``tokens``/``lengths``
    may be given as Python lists (``[B][K]``, ``[B]``); ``as_lists``: return
    ``(accepted [B], emitted [B][K+1])`` as Python lists instead of a ``VerifyResult`` (the
    engine's loop wants lists).  ``head_argmax`` (``[n, H]`` → int64 ``[n]``): the head's
    argmax in one call where the model has a fused one (``LeanDecoder._head_argmax``),
    used instead of ``head``."""
    drafts = tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens
    lens = lengths.tolist() if isinstance(lengths, torch.Tensor) else lengths
    B, K = hidden.shape[0], hidden.shape[1] - 1
    accepted = [0] * B
    emitted: list[list[int] | None] = [None] * B
    flat = hidden.reshape(B * (K + 1), hidden.shape[-1])
    j0, size = 0, first
    while j0 <= K and any(e is None for e in emitted):
        j1 = min(K + 1, j0 + size)
        # the (row, position) slots still to check: a row's positions past its draft's end
        # (lens[b] + 1 slots: the drafts, then the bonus) never are
        spans = [(b, j0, min(j1, lens[b] + 1)) for b in range(B) if emitted[b] is None]
        slots = [b * (K + 1) + j for b, a, e in spans for j in range(a, e)]
        if len(slots) == B * (j1 - j0):  # every row, every position: no gather needed
            picked = hidden[:, j0:j1]
        else:
            picked = flat.index_select(0, torch.tensor(slots, device=hidden.device))
        top = (head_argmax(picked) if head_argmax is not None else argmax_last(head(picked))).reshape(-1).tolist()
        at = 0
        for b, a, e in spans:
            row, at = top[at : at + e - a], at + e - a
            for j in range(a, e):
                t = row[j - a]
                if j < lens[b] and drafts[b][j] == t:
                    accepted[b] = j + 1
                    continue
                emitted[b] = drafts[b][:j] + [t] + [-1] * (K - j)
                break
        j0, size = j1, step
    if as_lists:
        return accepted, emitted
    dev = hidden.device
    return VerifyResult(torch.tensor(accepted, dtype=torch.long, device=dev),
                        torch.tensor(emitted, dtype=torch.long, device=dev).view(B, K + 1))


def random_inputs(generators: list[torch.Generator], k: int, vocab: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row random numbers for one verification: the plain step's uniform ``[B]``
    (float64), uniforms ``[B, k]`` and Exp(1) noise ``[B, V]``.

    The plain step's uniform is drawn first, so a row that drafts nothing samples exactly
    what ``sample_next`` would sample: its token does not depend on other rows' drafts."""
    first = row_uniforms(generators, device)
    exps = exponential_noise(generators, vocab, device)
    uniforms = torch.stack([torch.rand(k, generator=g, device=device) for g in generators])
    return first, uniforms, exps


def sample_next(logits: torch.Tensor, ctx_sampling, generators) -> torch.Tensor:
    """One plain decoding step from ``logits [B, V]`` → tokens [B]."""
    if ctx_sampling.greedy:
        return argmax_last(logits)
    p = warped_probs(logits, ctx_sampling)
    return sample_inverse_cdf(p, row_uniforms(generators, p.device))

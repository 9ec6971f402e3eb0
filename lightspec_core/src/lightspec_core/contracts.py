"""The engine's checks of what components return: a drafter's proposal and a verifier's
result against their contracts (``DraftProposal``, ``VerifyResult``).  Anything that breaks
them makes that step decode plainly (``Engine``), so the output stays the target's own."""

from __future__ import annotations

import torch

from .interfaces import DraftProposal, SparseProbs, VerifyResult
from .sampling import SamplingParams

# a drafter claiming that it drew a token of smaller probability than this is not believed
# (its p/q ratio would accept nearly anything): that row decodes plainly
MIN_DRAFT_PROB = 1e-9


INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def check_proposal(p: DraftProposal, limits: list[int], vocab: int, sampling: SamplingParams, runner
                   ) -> tuple[DraftProposal, list[str]]:
    """Validate a proposal against the contract (``DraftProposal``); return it (padding
    zeroed, chains given as explicit parents turned into ``parents=None``, and rows whose
    sampling probabilities cannot be trusted dropped to length 0) and the problems found
    with single rows.  Raises ValueError/TypeError when the proposal as a whole breaks it."""
    if not isinstance(p, DraftProposal):
        raise TypeError(f"propose returned a {type(p).__name__}, expected a DraftProposal or None")
    B = len(limits)
    if p.tokens.shape[0] != B:
        raise ValueError(f"proposal has {p.tokens.shape[0]} rows, the batch has {B}")
    for name in ("tokens", "lengths", "parents"):
        t = getattr(p, name)
        if t is not None and t.dtype not in INT_DTYPES:
            raise TypeError(f"proposal {name} have dtype {t.dtype}; token ids, lengths and parents must be integers")
    if p.tokens.dtype != torch.long:
        p.tokens = p.tokens.long()
    if p.lengths.dtype != torch.long:
        p.lengths = p.lengths.long()
    N = p.max_len
    if N == 0:
        return p, []
    p.forget_rows()
    lens, toks = p.lengths.tolist(), p.tokens.tolist()
    pars = p.parents.tolist() if p.parents is not None else None
    padded, chain = False, True
    for b, (n, m, row) in enumerate(zip(lens, limits, toks)):
        if n < 0 or n > m or n > N:
            raise ValueError(f"proposal row {b} has length {n}, allowed 0..{min(m, N)}")
        if n and (min(row[:n]) < 0 or max(row[:n]) >= vocab):
            raise ValueError(f"proposal row {b} has token ids outside [0, {vocab}): {[t for t in row[:n] if not 0 <= t < vocab][:3]}")
        padded = padded or any(row[n:])
        if pars is not None:
            par = pars[b][:n]
            for j, q in enumerate(par):
                if not -1 <= q < j:
                    raise ValueError(f"proposal row {b} node {j} has parent {q}; allowed -1 (the last token) or 0..{j - 1}")
            chain = chain and par == list(range(-1, n - 1))
    if padded:  # zero what lies beyond each row's length
        real = torch.arange(N, device=p.tokens.device)[None, :] < p.lengths[:, None]
        p.tokens = torch.where(real, p.tokens, 0)
    p.__dict__["_node_rows"] = [row[:n] for row, n in zip(toks, lens)]  # node_rows(), from the lists read above
    if pars is not None:
        if chain:
            p.parents = None
        elif not runner.supports_trees():
            raise ValueError(f"a token tree was proposed, but this target ({runner.model_type}) does not take the "
                             f"custom attention masks trees need: propose chains (parents=None)")
        else:
            p.parents = p.parents.long()
    for name in ("confidence", "entropy"):
        t = getattr(p, name)
        if t is not None and (not isinstance(t, torch.Tensor) or t.shape != p.tokens.shape):
            raise ValueError(f"proposal {name} must be [B, N]={tuple(p.tokens.shape)} or None")
    problems = [] if sampling.greedy or p.probs is None else _untrusted_rows(p, lens, vocab)
    return p, problems


def _untrusted_rows(p: DraftProposal, lens: list[int], vocab: int) -> list[str]:
    """Rows whose draft probabilities cannot be used for rejection sampling (non-finite or
    negative values, a proposed token of probability below ``MIN_DRAFT_PROB``, rows that do
    not sum to 1): their length is set to 0 (they decode plainly this step)."""
    probs = p.probs
    if isinstance(probs, SparseProbs):
        if probs.ids.shape[:2] != p.tokens.shape:
            raise ValueError(f"proposal sparse probs must be [B, N, k] with [B, N]={tuple(p.tokens.shape)}")
        values, at_token = probs.probs.float(), probs.of_tokens(p.tokens)
        bad_ids = ((probs.ids < 0) | (probs.ids >= vocab)).any(-1)
        total_ok = values.sum(-1) <= 1.0 + 1e-3
    else:
        if not isinstance(probs, torch.Tensor) or probs.dim() != 3 or probs.shape[:2] != p.tokens.shape:
            raise ValueError(f"proposal probs must be [B, N, V] with [B, N]={tuple(p.tokens.shape)}, a SparseProbs or None")
        if probs.shape[-1] != vocab:
            raise ValueError(f"proposal probs have vocabulary {probs.shape[-1]}, the target has {vocab}")
        values = probs.float()
        at_token = values.gather(2, p.tokens[:, :, None]).squeeze(2)
        bad_ids = torch.zeros(p.tokens.shape, dtype=torch.bool, device=values.device)
        total_ok = (values.sum(-1) - 1.0).abs() <= 1e-3
    finite = torch.isfinite(values).all(-1) & (values >= 0).all(-1)
    ok = finite & ~bad_ids & total_ok & (at_token >= MIN_DRAFT_PROB)
    real = torch.arange(p.max_len, device=ok.device)[None, :] < p.lengths[:, None]
    row_ok = (ok | ~real).all(-1).tolist()
    if all(row_ok):
        return []
    bad = [b for b, good in enumerate(row_ok) if not good]
    b = bad[0]
    j = int((~ok[b] & real[b]).nonzero()[0])
    problems = [f"{len(bad)} of {len(row_ok)} rows' draft probabilities cannot be used (row {b} node {j}: "
                f"probability {float(at_token[b, j]):.3g} at the proposed token; they must be finite, >= 0, sum "
                f"to 1, and >= {MIN_DRAFT_PROB:g} at the proposed token): those rows decode plainly"]
    keep = torch.tensor(row_ok, device=p.lengths.device)
    p.lengths = torch.where(keep, p.lengths, 0)
    p.forget_rows()
    return problems


def check_result(result: VerifyResult, p: DraftProposal, vocab: int
                 ) -> tuple[list[int], list[list[int]], list[list[int]] | None]:
    """A verifier's result as (accepted, emitted, paths) lists, checked against the
    proposal: counts within each row's draft, emitted tokens = the kept nodes' tokens then
    one token in [0, vocab), a tree's path a chain of parent links from the root."""
    if not isinstance(result, VerifyResult):
        raise TypeError(f"verify returned a {type(result).__name__}, expected a VerifyResult")
    accepted, emitted, paths = result.as_lists()
    nodes, parents = p.node_rows(), p.parent_rows()
    if len(accepted) != len(nodes) or len(emitted) != len(nodes):
        raise ValueError(f"verify result has {len(accepted)} rows, the batch has {len(nodes)}")
    if parents is not None and paths is None:
        raise ValueError("verify result for a token tree has no path (VerifyResult.path)")
    for b, (a, e, row) in enumerate(zip(accepted, emitted, nodes)):
        if not 0 <= a <= len(row) or len(e) != a + 1:
            raise ValueError(f"verify result row {b} accepts {a} of {len(row)} nodes with {len(e)} tokens emitted")
        kept = paths[b] if paths is not None else list(range(a))
        if parents is not None:
            prev = -1
            for i in kept:
                if not (0 <= i < len(row)) or parents[b][i] != prev:
                    raise ValueError(f"verify result row {b}: path {kept} does not follow the tree's parent links")
                prev = i
        if any(e[j] != row[i] for j, i in enumerate(kept)) or not 0 <= e[a] < vocab:
            raise ValueError(f"verify result row {b}: emitted tokens {e} do not match the kept nodes")
    return accepted, emitted, paths

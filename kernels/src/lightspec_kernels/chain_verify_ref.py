"""PyTorch reference for batched chain verification (the contract the Triton kernel must match).

Lossless speculative verification (Leviathan et al. 2023, Chen et al. 2023):
accept draft token x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first
rejection emit a token sampled from norm(max(p_i - q_i, 0)); when every draft token
of a row is accepted emit a bonus token sampled from p_K.  Drafters without
probabilities (n-gram) pass ``draft_probs=None``: q is one-hot on the drafted token,
so acceptance is p(x) and the recovered token comes from p with x zeroed.

Randomness is an input, so that the reference and the kernel agree bit for bit:
``uniforms[b, i]`` decides acceptance of draft position i, and the recovered or bonus
token of row b is ``argmax(r / exponentials[b])`` over the (unnormalised) residual r,
which is an exact sample from norm(r) when ``exponentials`` ~ Exp(1) i.i.d.
"""

from __future__ import annotations

import torch


def chain_verify_ref(
    draft_tokens: torch.Tensor,  # [B, K] int64; entries at i >= draft_lens[b] are ignored
    draft_lens: torch.Tensor,  # [B] int64, 0 <= draft_lens[b] <= K
    target_probs: torch.Tensor,  # [B, K+1, V] float; greedy: logits are fine (only argmax is used)
    draft_probs: torch.Tensor | None = None,  # [B, K, V] float or None (one-hot drafts)
    uniforms: torch.Tensor | None = None,  # [B, K] float in [0, 1); None selects greedy verification
    exponentials: torch.Tensor | None = None,  # [B, V] float, Exp(1) samples; required when sampling
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify B ragged chains of drafts.

    Returns ``(accepted [B] int64, emitted [B, K+1] int64)``: row b emits its first
    ``accepted[b]`` draft tokens followed by one recovered/bonus token; the rest of the
    row is -1.
    """
    B, K = draft_tokens.shape
    device = draft_tokens.device
    positions = torch.arange(K, device=device)
    in_draft = positions[None, :] < draft_lens[:, None]  # [B, K]
    if uniforms is None:
        target_ids = target_probs.argmax(dim=-1)  # [B, K+1]
        match = (target_ids[:, :K] == draft_tokens) & in_draft
        accepted = torch.cumprod(match.long(), dim=1).sum(dim=1)  # [B]
        final = target_ids.gather(1, accepted[:, None]).squeeze(1)  # [B]
    else:
        # Fix (lightspec-kernels): entries past draft_lens are documented as ignored, but they
        # were used as gather/scatter indices below (an out-of-vocabulary pad such as V or a
        # large sentinel raised an IndexError).  Replace them by token 0; valid inputs are
        # unaffected because those slots never influence the result.
        draft_tokens = torch.where(in_draft, draft_tokens, torch.zeros_like(draft_tokens))
        p = target_probs.float()
        p_draft = p[:, :K].gather(2, draft_tokens.clamp(min=0)[:, :, None]).squeeze(2)  # [B, K]
        if draft_probs is None:
            q_draft = torch.ones_like(p_draft)
        else:
            q_draft = draft_probs.float().gather(2, draft_tokens.clamp(min=0)[:, :, None]).squeeze(2)
        # accept iff u * q < p  (== u < min(1, p/q) for q > 0, and never accepts p == 0)
        ok = (uniforms.float() * q_draft < p_draft) & in_draft
        accepted = torch.cumprod(ok.long(), dim=1).sum(dim=1)  # [B]
        rows = torch.arange(B, device=device)
        p_at = p[rows, accepted]  # [B, V]: target distribution at the first unverified slot
        rejected = accepted < draft_lens  # bonus rows sample straight from p_K
        residual = p_at.clone()
        if rejected.any():
            idx = accepted.clamp(max=K - 1)
            if draft_probs is None:
                q_at = torch.zeros_like(p_at)
                q_at[rows, draft_tokens[rows, idx]] = 1.0
                q_at = q_at * p_at  # one-hot q: residual is p with the drafted token zeroed
            else:
                q_at = draft_probs.float()[rows, idx]
            res = (p_at - q_at).clamp(min=0)
            # numerically all-zero residual (p == q): fall back to p itself
            empty = res.sum(dim=-1, keepdim=True) <= 0
            res = torch.where(empty, p_at, res)
            residual = torch.where(rejected[:, None], res, p_at)
        final = (residual / exponentials.float()).argmax(dim=-1)
    emitted = torch.full((B, K + 1), -1, dtype=torch.long, device=device)
    emitted[:, :K] = torch.where(positions[None, :] < accepted[:, None], draft_tokens, -1)
    emitted.scatter_(1, accepted[:, None], final[:, None])
    return accepted, emitted

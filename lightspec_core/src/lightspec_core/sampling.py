"""Sampling parameters and the logits warping that HF ``generate`` applies.

Verification must compare the *warped* distributions actually sampled from, so the
target and every drafter warp with these same functions.  Order matches
``transformers``: temperature, then top-k, then top-p, then min-p.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings.  ``temperature == 0`` means greedy."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature={self.temperature!r} is invalid: use a finite number >= 0 (0 = greedy)")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k={self.top_k!r} is invalid: use an integer >= 0 (0 = off)")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p={self.top_p!r} is invalid: use a number in (0, 1]")
        if not (isinstance(self.min_p, (int, float)) and 0 <= self.min_p < 1):
            raise ValueError(f"min_p={self.min_p!r} is invalid: use a number in [0, 1)")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r} is invalid: use an integer or None")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply temperature/top-k/top-p/min-p to ``logits [..., V]``; returns fp32 logits
    with removed tokens set to -inf (same rules and tie handling as HF's warpers)."""
    x = logits.float()
    if params.temperature not in (0, 1):
        x = x / params.temperature
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, sorted_idx = torch.sort(x, dim=-1, descending=False)
        cum = sorted_x.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - params.top_p)
        remove_sorted[..., -1:] = False  # keep at least one token
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        x = x.masked_fill(remove, float("-inf"))
    if params.min_p > 0:
        probs = x.softmax(dim=-1)
        top = probs.amax(dim=-1, keepdim=True)
        x = x.masked_fill(probs < params.min_p * top, float("-inf"))
    return x


def argmax_last(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)`` (int64; the first maximum, NaN counting as the largest), through
    NumPy for float CPU tensors: PyTorch's CPU argmax took 22 us for 3 x 8,192 logits on
    the 2-core VM, NumPy's 2.6 us, and greedy decoding takes one every step."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and not x.requires_grad:
        return torch.from_numpy(x.numpy().argmax(-1))
    return x.argmax(dim=-1)


def exponential_noise(generators: list[torch.Generator], vocab: int, device) -> torch.Tensor:
    """Exp(1) noise ``[B, vocab]``, row b drawn from ``generators[b]``, for sampling a token
    as ``argmax(p / noise)`` (the exponential race: exactly a draw from ``p``).

    Drawn as ``-log(U)`` with U uniform on [0, 1): the same distribution as
    ``Tensor.exponential_``, which on the CPU took 2.0-2.5 ms for 8 x 8,192 values against
    0.47 ms for this (1 thread); a sampled batch of 8 draws such a tensor on every verify
    step, and a model drafter on every draft position (a plain step samples by
    ``sample_inverse_cdf`` instead).  U = 0 gives +inf, whose quotient is 0,
    so a token is never picked through it."""
    return torch.stack([torch.rand(vocab, generator=g, device=device) for g in generators]).log_().neg_()


def row_uniforms(generators: list[torch.Generator], device) -> torch.Tensor:
    """One uniform on [0, 1) per row ``[B]`` (float64), row b drawn from ``generators[b]``."""
    return torch.cat([torch.rand(1, generator=g, device=device, dtype=torch.float64) for g in generators])


def sample_inverse_cdf(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """A token per row from probabilities ``p [B, V]`` (need not sum to 1) with one uniform
    per row ``u [B]`` on [0, 1): the first token whose cumulative probability exceeds
    ``u`` times the row's total (float64 sums).  Exactly a draw from ``p / p.sum()``; a
    token of probability 0 is never picked.

    Why: a plain sampled step needs one random number per row this way, against V for the
    exponential race (``exponential_noise``): at batch 8 over 8,192 tokens the noise cost
    ~0.6 ms of a 12.5 ms step on a Zen 3 VM (``torch.rand`` with a per-row generator, 57 us
    a row, and its log), this ~30 us."""
    cum = p.double().cumsum(-1)
    pick = torch.searchsorted(cum, (u.to(cum.device) * cum[:, -1])[:, None], right=True)
    return pick.squeeze(-1).clamp_(max=p.shape[-1] - 1)


def warped_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``softmax(warp_logits(logits))`` in fp32, shape as ``logits``."""
    return warp_logits(logits, params).softmax(dim=-1)


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """A generator for one request: seeded when ``seed`` is given, else from OS entropy."""
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g

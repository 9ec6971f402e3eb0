"""Sampling parameters and the logits warping that HF ``generate`` applies.

Verification must compare the *warped* distributions actually sampled from, so the
target and every drafter warp with these same functions.  Order matches
``transformers``: temperature, then top-k, then top-p, then min-p.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from .errors import InvalidTypeError, InvalidValueError

# The smallest temperature > 0 allowed: ``warp_logits`` divides float32 logits by the
# temperature, and below this a logit as large as the float16 maximum (65504) overflows
# float32 (3.4e38), which turns the warped distribution into NaN.
MIN_TEMPERATURE = 65504 / 3.4028234663852886e38  # 1.92e-34

SEED_RANGE = (-(2**63), 2**64)  # what torch.Generator.manual_seed takes: [low, high)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings.  ``temperature == 0`` means greedy.

    Allowed values (anything else raises ``InvalidTypeError`` for a wrong type or
    ``InvalidValueError`` for a wrong value, both ``LightSpecError``s):

    * ``temperature``: 0 (greedy) or a finite number >= ``MIN_TEMPERATURE`` (1.92e-34).
      Temperatures in (0, ``MIN_TEMPERATURE``) are refused: dividing float32 logits by them
      overflows to inf and the distribution becomes NaN.  HF ``generate`` does the same
      division (``TemperatureLogitsWarper`` only refuses temperature <= 0) and then fails
      in sampling ("probability tensor contains either inf, nan or element < 0"), so such
      temperatures never worked there either; LightSpec refuses them up front, for every
      model, instead of depending on the size of the logits.  Their limit is greedy
      decoding: use ``temperature=0``.
    * ``top_k``: an integer >= 0 (0 = off); ``top_p``: a number in (0, 1];
      ``min_p``: a number in [0, 1); ``seed``: ``None`` or an integer in [-2**63, 2**64).

    Numbers are stored as ``float`` (``temperature``, ``top_p``, ``min_p``) and ``int``
    (``top_k``, ``seed``); ``bool`` is refused everywhere.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self):
        t = _number("temperature", self.temperature, "a finite number >= 0 (0 = greedy)")
        if not (t >= 0 and math.isfinite(t)):
            raise InvalidValueError(f"temperature={self.temperature!r} is invalid: use a finite number >= 0 (0 = greedy)")
        if 0 < t < MIN_TEMPERATURE:
            raise InvalidValueError(
                f"temperature={self.temperature!r} is too small: float32 logits divided by it overflow; "
                f"use 0 for greedy decoding or a temperature >= {MIN_TEMPERATURE:.3g}"
            )
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral):
            raise InvalidTypeError(f"top_k={self.top_k!r} ({type(self.top_k).__name__}) is invalid: use an integer >= 0 (0 = off)")
        if self.top_k < 0:
            raise InvalidValueError(f"top_k={self.top_k!r} is invalid: use an integer >= 0 (0 = off)")
        top_p = _number("top_p", self.top_p, "a number in (0, 1]")
        if not 0 < top_p <= 1:
            raise InvalidValueError(f"top_p={self.top_p!r} is invalid: use a number in (0, 1]")
        min_p = _number("min_p", self.min_p, "a number in [0, 1)")
        if not 0 <= min_p < 1:
            raise InvalidValueError(f"min_p={self.min_p!r} is invalid: use a number in [0, 1)")
        if self.seed is not None:
            if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
                raise InvalidTypeError(f"seed={self.seed!r} ({type(self.seed).__name__}) is invalid: use an integer or None")
            if not SEED_RANGE[0] <= self.seed < SEED_RANGE[1]:
                raise InvalidValueError(f"seed={self.seed!r} is invalid: use an integer in [-2**63, 2**64) or None")
            object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "temperature", t)
        object.__setattr__(self, "top_k", int(self.top_k))
        object.__setattr__(self, "top_p", top_p)
        object.__setattr__(self, "min_p", min_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _number(name: str, value, allowed: str) -> float:
    """``value`` as a float when it is a real number (not a bool), else ``InvalidTypeError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidTypeError(f"{name}={value!r} ({type(value).__name__}) is invalid: use {allowed}")
    return float(value)


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

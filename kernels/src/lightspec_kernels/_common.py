"""Shared helpers: backend dispatch and argument checks."""

from __future__ import annotations

import os

import torch

try:  # Triton is optional: the PyTorch references work everywhere.
    import triton  # noqa: F401
    import triton.language as tl  # noqa: F401

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only without triton
    HAS_TRITON = False

ENV_VAR = "LIGHTSPEC_KERNELS"
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def backend_for(*tensors: torch.Tensor | None) -> str:
    """Return ``"triton"`` or ``"torch"`` for a call on ``tensors``.

    Default: Triton when triton is importable and every tensor is on CUDA, else the
    PyTorch reference.  ``LIGHTSPEC_KERNELS=torch|triton`` forces one.  Forcing Triton
    on CPU tensors only works under the Triton interpreter (``TRITON_INTERPRET=1``).
    """
    mode = os.environ.get(ENV_VAR, "").strip().lower()
    if mode == "torch":
        return "torch"
    if mode not in ("", "auto", "triton"):
        raise ValueError(f"{ENV_VAR}={mode!r}: allowed values are 'torch', 'triton' or unset")
    present = [t for t in tensors if t is not None]
    if mode == "triton":
        if not HAS_TRITON:
            raise RuntimeError(f"{ENV_VAR}=triton but triton is not installed")
        if any(not t.is_cuda for t in present) and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                f"{ENV_VAR}=triton with CPU tensors needs the Triton interpreter (TRITON_INTERPRET=1, "
                "set before triton is imported)"
            )
        return "triton"
    if HAS_TRITON and present and all(t.is_cuda for t in present):
        return "triton"
    return "torch"


def describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


def check_tensor(
    name: str,
    t: object,
    *,
    ndim: int | None = None,
    shape: tuple[int | None, ...] | None = None,
    dtypes: tuple[torch.dtype, ...] | None = None,
    device: torch.device | None = None,
    expect: str = "",
) -> None:
    """Raise one ValueError naming ``name``, what it is and what is allowed."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor {expect}, got {type(t).__name__}")
    bad = []
    if ndim is not None and t.dim() != ndim:
        bad.append(f"{ndim} dimensions")
    if shape is not None and (t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape))):
        want = ", ".join("*" if s is None else str(s) for s in shape)
        bad.append(f"shape ({want})")
    if dtypes is not None and t.dtype not in dtypes:
        bad.append("dtype in " + "/".join(str(d).replace("torch.", "") for d in dtypes))
    if device is not None and t.device != device:
        bad.append(f"device {device}")
    if bad:
        raise ValueError(f"{name}: got {describe(t)}; expected {', '.join(bad)} {expect}".rstrip())


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def plan_splits(V: int, block: int, programs: int, device: torch.device, num_splits: int | None) -> tuple[int, int]:
    """Split a length-V scan into S chunks (multiples of ``block``); returns (S, chunk).

    ``programs`` independent rows already run in parallel; on CUDA the vocabulary is
    split until there are about four programs per SM, so small batches still use the
    whole GPU's memory bandwidth.  Elsewhere (interpreter) the default is no split.
    ``num_splits`` forces a count (capped by the number of blocks).
    """
    n_blocks = max(1, -(-V // block))
    if num_splits is None:
        if device.type == "cuda":
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            num_splits = max(1, -(-4 * sms // max(programs, 1)))
        else:
            num_splits = 1
    s = max(1, min(int(num_splits), n_blocks))
    chunk = -(-n_blocks // s) * block
    return -(-V // chunk), chunk


def check_verify_inputs(target_probs, draft_probs, uniforms, exponentials, *, batch: int, slots: int,
                        slot_name: str, device) -> int:
    """Checks shared by the chain and tree verifiers; returns V.

    target_probs: [B, slots+1 or slots, V] (already shape-checked by the caller's first dims)
    draft_probs:  [B, slots, V] or None;  uniforms: [B, slots] or None;  exponentials: [B, V]
    """
    V = target_probs.shape[2]
    if V == 0:
        raise ValueError(f"target_probs: got shape {tuple(target_probs.shape)}; expected V > 0")
    if draft_probs is not None:
        check_tensor("draft_probs", draft_probs, shape=(batch, slots, V), dtypes=FLOAT_DTYPES, device=device,
                     expect=f"(draft_probs [B, {slot_name}, V] or None)")
    if uniforms is not None:
        check_tensor("uniforms", uniforms, shape=(batch, slots), dtypes=FLOAT_DTYPES, device=device,
                     expect=f"(uniforms [B, {slot_name}] in [0, 1), or None for greedy)")
        if exponentials is None:
            raise ValueError(
                "exponentials: got None; expected a [B, V] float tensor of Exp(1) samples when uniforms is given"
            )
        check_tensor("exponentials", exponentials, shape=(batch, V), dtypes=FLOAT_DTYPES, device=device,
                     expect="(exponentials [B, V], Exp(1) samples)")
    return V

"""Tests run every Triton kernel in the interpreter on CPU tensors.

TRITON_INTERPRET must be set before triton is first imported, so it is set here, at
conftest import time, before the test modules import lightspec_kernels.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(2)


@pytest.fixture
def gen():
    """A fresh, differently-seeded generator per test (random inputs each run)."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def force_triton(monkeypatch):
    monkeypatch.setenv("LIGHTSPEC_KERNELS", "triton")


@pytest.fixture
def force_torch(monkeypatch):
    monkeypatch.setenv("LIGHTSPEC_KERNELS", "torch")

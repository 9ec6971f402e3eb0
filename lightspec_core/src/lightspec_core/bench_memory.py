"""Peak memory of a benchmarked method: PyTorch's peak on CUDA, the C heap's bytes in use
on the CPU (glibc ``mallinfo2``), sampled by a thread."""

from __future__ import annotations

import os
import platform
import threading

import torch

# lockstep runs measure peak memory this many times per method and workload and keep the
# lowest: the first run may include one-time allocations (measured: `none` at batch 8,
# 128 MB on its first run, 111 MB on its second)
MEMORY_RUNS = 2


class PeakMemory:
    """Peak memory in use above the level at start: on CUDA, PyTorch's peak allocated
    memory; on the CPU, the C heap's bytes in use (glibc's ``mallinfo2``: where PyTorch's
    CPU tensors live), sampled every ``interval`` seconds, or the resident set where that
    is not available.  In-use bytes, not the resident set: once an earlier run has grown the
    heap, a run that reuses it adds no resident memory however much it allocates (in
    lockstep every method's allocations grow it first, and each method's own run then
    measured +0.0 MB)."""

    def __init__(self, device: torch.device, enabled: bool = True, interval: float = 0.02):
        self.device = device
        self.enabled = enabled
        self.interval = interval  # 20 ms during a timed run: sampling more often steals the GIL from it
        self.extra = 0.0

    def __enter__(self):
        if not self.enabled:
            return self
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return self
        self.base = self.peak = _cpu_memory()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self):
        while not self.stop.wait(self.interval):
            self.peak = max(self.peak, _cpu_memory())

    def __exit__(self, *exc):
        if not self.enabled:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.extra = (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**20
        else:
            self.stop.set()
            self.thread.join()
            self.peak = max(self.peak, _cpu_memory())
            self.extra = (self.peak - self.base) / 2**20


def _heap_in_use():
    """A function returning the C heap's bytes in use (glibc), or None elsewhere."""
    import ctypes
    import ctypes.util

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype = MallInfo2

    def in_use() -> int:
        m = fn()
        return m.uordblks + m.hblkhd  # allocated chunks + mmap-ed blocks (large tensors)

    return in_use


_HEAP = _heap_in_use() if platform.system() == "Linux" else None


def _cpu_memory() -> int:
    return _HEAP() if _HEAP is not None else _rss()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

"""This process's peak host memory, in two readings.

`ru_maxrss` counts every resident page, including the model files' pages that loading maps
into memory: those belong to the page cache, are shared by every process reading the same
files, and the kernel can drop them. The anonymous peak (`RssAnon`, sampled by a thread, since
the kernel keeps no high-water mark of it) is the memory the process itself holds: the figure
to size a node's RAM by, per process. Pinned host memory (the offloaded activations) is neither:
the driver maps it outside the process's anonymous pages, but it is locked and counts in the pod's
memory cgroup, so `pinned_peak_gib` reads it from PyTorch's pinned allocator, whose cache keeps
every block it ever handed out (the figure the node must hold).
"""

from __future__ import annotations

import resource
import threading
from pathlib import Path

STATUS = Path("/proc/self/status")


def _anon_kib() -> int:
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class HostMemory:
    """Samples RssAnon every `interval` seconds on a daemon thread from `start()` on."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self._peak_kib = _anon_kib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="host-memory", daemon=True)

    def start(self) -> HostMemory:
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._peak_kib = max(self._peak_kib, _anon_kib())

    def stop(self) -> None:
        self._stop.set()

    @property
    def anon_peak_gib(self) -> float:
        self._peak_kib = max(self._peak_kib, _anon_kib())
        return self._peak_kib / 2**20

    @staticmethod
    def pinned_peak_gib() -> float:
        """Peak bytes PyTorch's pinned host allocator held (0 before CUDA starts or without it)."""
        import torch

        # torch 2.7 leaves torch.cuda.is_initialized unannotated.
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            return 0.0
        stats = torch.cuda.host_memory_stats()
        return float(stats.get("reserved_bytes.peak", stats.get("allocated_bytes.peak", 0))) / 2**30

    @staticmethod
    def resident_peak_gib() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux

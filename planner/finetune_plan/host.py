"""The host memory a trainer pod needs, from its plan: the pod's memory request and limit.

Each process holds the same base (Python, torch, CUDA's host libraries, the tokenizer and the
dataset's rows) and what its loader stages on the host. fsdp's loader today holds the whole
packed model on each process's host until it is sharded; the other loaders go straight to the
GPUs one tensor at a time, so the most they stage is the largest tensor in fp32 (the embedding
matrix of a large vocabulary). The checkpoint's files are read through the page cache, which
the kernel reclaims under the pod's limit and is not counted.

The pod asks for `processes x per process`, plus a margin stated here (and in the README):
10 % for allocator slack and the dataset's rows, plus 2 GiB for the launcher process, NCCL's
host buffers and a CUDA context's host side. A pod with less is OOM-killed while loading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from .memory import GIB, POD_HOST_MARGIN_BYTES, POD_HOST_MARGIN_FRACTION, pod_host_bytes
from .plan import Plan

MARGIN_FRACTION: Final = POD_HOST_MARGIN_FRACTION
MARGIN_BYTES: Final = POD_HOST_MARGIN_BYTES


@dataclass(frozen=True)
class HostNeed:
    """The pod's host memory: `processes` trainers of `per_process` bytes each, plus the margin."""

    per_process: float
    processes: int
    mode: str  # the spec's word, for the message
    pinned: float = 0.0  # of per_process: offloaded activations in pinned memory (activationOffload)
    refusal: str | None = None  # the plan's: above what a node offers (`plan.Plan.host_refusal`)

    @property
    def pod_bytes(self) -> float:
        return pod_host_bytes(self.per_process, self.processes)

    @property
    def gib(self) -> int:
        """Whole GiB, rounded up: the quantity the operator writes."""
        return math.ceil(self.pod_bytes / GIB)

    @property
    def quantity(self) -> str:
        return f"{self.gib}Gi"

    def describe(self) -> str:
        per = self.per_process / GIB
        return (
            f"{self.quantity} of host memory for the pod: {self.processes} process"
            f"{'' if self.processes == 1 else 'es'} x {per:.1f} GiB ({self.mode}"
            f"{' streams the checkpoint' if self.mode == 'fsdp' and self.processes > 1 else ''}: at most the"
            " largest tensor in fp32 on the host"
            + (f", plus {self.pinned / GIB:.1f} GiB of offloaded activations, pinned" if self.pinned else "")
            + ")"
            f" + {MARGIN_FRACTION:.0%} + {MARGIN_BYTES / GIB:.0f} GiB"
        )


def host_need(plan: Plan, processes: int) -> HostNeed:
    return HostNeed(
        plan.host_gib_per_process * GIB,
        processes,
        plan.parallelism,
        plan.pinned_host_gib_per_process * GIB,
        plan.host_refusal,
    )


def shortfall(need: HostNeed, asked_bytes: int) -> str | None:
    """The one-line refusal when `asked_bytes` (spec.resources.memory) is below the need, else None."""
    if asked_bytes >= need.pod_bytes:
        return None
    return (
        f"spec.resources.memory {asked_bytes / GIB:.1f} GiB is below the {need.describe()}; "
        f"raise it to at least {need.quantity} or leave it unset for the operator to size the pod"
    )

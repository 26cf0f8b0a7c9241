"""The host memory a trainer pod needs, from its plan: the pod's memory request and limit.

Each process holds what it holds at its load (`process`) plus what it pins (`pinned`). The pod
asks for `processes x per process`, plus a margin stated here (and in the README): 10 % for
allocator slack and the dataset's rows, plus 2 GiB for the launcher process, NCCL's host buffers
and a CUDA context's host side. A pod with less is OOM-killed while loading. The operator writes
the figure in whole GiB, rounded up (`whole_gib`), and a limit is held to the same rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from finetune_api.modes import processes, to_spec

from ..memory import GIB, Recipe
from ..model_shape import ModelShape
from ..speed import Mode
from .pinned import offload_host_bytes
from .process import host_bytes_per_process, whole_load_host_bytes_per_process

# The pod's margin over its trainers' host memory (the module's docstring says why; the README states it).
MARGIN_FRACTION: Final = 0.10
MARGIN_BYTES: Final = 2 * GIB


def pod_host_bytes(per_process: float, count: int) -> float:
    """The host memory a pod of `count` trainers of `per_process` bytes asks for."""
    return count * per_process * (1 + MARGIN_FRACTION) + MARGIN_BYTES


def per_process_within(pod_bytes: float, count: int) -> float:
    """The most host memory each of `count` trainers may hold in a pod of `pod_bytes`
    (`pod_host_bytes` the other way round)."""
    return (pod_bytes - MARGIN_BYTES) / (count * (1 + MARGIN_FRACTION))


def whole_gib(nbytes: float) -> int:
    """`nbytes` in whole GiB, rounded up: the quantity the operator writes for the pod."""
    return math.ceil(nbytes / GIB)


@dataclass(frozen=True)
class HostNeed:
    """The pod's host memory: `processes` trainers of `per_process` bytes each, plus the margin."""

    per_process: float
    processes: int
    mode: str  # the spec's word, for the message
    pinned: float = 0.0  # of per_process: offloaded activations in pinned memory (activationOffload)
    refusal: str | None = None  # the plan's: above what a node offers (`Plan.host_refusal`)
    # fsdp over several GPUs on a checkpoint it cannot stream: the whole packed model per process
    # (the trainer refuses that load when the pod's memory is below it); None for every other plan.
    whole_load: float | None = None

    @property
    def pod_bytes(self) -> float:
        return pod_host_bytes(self.per_process, self.processes)

    @property
    def gib(self) -> int:
        """Whole GiB, rounded up: the quantity the operator writes."""
        return whole_gib(self.pod_bytes)

    @property
    def quantity(self) -> str:
        return f"{self.gib}Gi"


def need_of(shape: ModelShape, recipe: Recipe, mode: Mode, gpus: int) -> HostNeed:
    """The host memory of a pod that trains `recipe` in `mode` on `gpus` GPUs, one process per
    GPU (deviceMap: one)."""
    word = to_spec(mode)
    pinned = offload_host_bytes(shape, recipe)
    whole_load = None
    if mode == "fsdp" and gpus > 1:
        whole_load = whole_load_host_bytes_per_process(shape, recipe)
    return HostNeed(host_bytes_per_process(shape) + pinned, processes(word, gpus), word, pinned, None, whole_load)


def pod_bytes(shape: ModelShape, recipe: Recipe, mode: Mode, gpus: int) -> float:
    """The pod's host memory for `recipe` in `mode` on `gpus` GPUs (`HostNeed.pod_bytes`)."""
    return need_of(shape, recipe, mode, gpus).pod_bytes

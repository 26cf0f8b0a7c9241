"""The GPUs a plan is for, and one mode's memory on each of them.

`Layout` is what every mode's layout (`layouts`) returns and what the search weighs: whether it
fits, its fullest GPU, how far it is from fitting, and whether it leaves the planner's margin.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .. import calibration as cal
from ..gpu_products import GpuProduct
from ..memory import GIB, GpuMemory
from ..placement import Placement
from ..speed import Mode


@dataclass(frozen=True)
class Hardware:
    """The GPUs one pod gets: how many, which product, and how much memory each has."""

    gpus: int
    product: GpuProduct
    memory_gib: float

    @property
    def capacity(self) -> float:
        return self.memory_gib * GIB

    def with_gpus(self, gpus: int) -> Hardware:
        return replace(self, gpus=gpus)


@dataclass(frozen=True)
class Layout:
    """One mode's memory on every GPU."""

    mode: Mode
    per_gpu: tuple[GpuMemory, ...]
    loss_chunk_tokens: int
    placement: Placement | None = None

    @property
    def fits(self) -> bool:
        return all(g.headroom >= 0 for g in self.per_gpu)

    @property
    def fullest(self) -> GpuMemory:
        return min(self.per_gpu, key=lambda g: g.headroom)

    @property
    def shortfall(self) -> float:
        return max(0.0, -self.fullest.headroom)

    def leaves_margin(self, logits_block: float) -> bool:
        """Whether the fullest GPU keeps the planner's margin, `cal.SHORT_HEADROOM_GIB`, and with a
        whole-sequence loss one more block of its logits (`memory.logits_block_bytes`): the
        chunked loss keeps the math, a whole one asks for a spare seq x vocab block besides."""
        return self.fullest.headroom >= cal.SHORT_HEADROOM_GIB * GIB + (0 if self.loss_chunk_tokens else logits_block)

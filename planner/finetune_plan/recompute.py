"""`training.gradientCheckpointing: auto` and `training.activationOffload`: how many decoder layers
keep their activations on the GPU, and whether the rest go to host memory instead of recomputing.

Checkpointing every layer recomputes every forward in the backward (a quarter of the step for an
8B model at 2048 tokens); none at all does not fit a P40. `auto` keeps the activations of as many
layers as the memory the plan leaves holds, less the planner's margin (`cal.SHORT_HEADROOM_GIB`,
and with a whole-sequence loss one more seq x vocab block, as `plan._safest` asks of any plan),
and checkpoints the rest. The trainer keeps the model's last layers: the backward runs them first
and frees what they kept before the first recompute, so keeping one layer or more costs no
recompute temporaries (`memory.layer_pass_temporaries`).

The memory a layer keeps without checkpointing is `memory.full_layer_activation_bytes`, counted
from the tensors the recipe keeps and set against the trainer's own measurement of it (the phase
probe, bench/results/2026-12-02-h200-parts.json: 1.047 GiB per 8B-shaped layer at 2048 tokens,
planned 1.047). Whole runs judge the sum (`bench/calibration/memory-fit.json`): every committed
run through the pod's command within 4 % of its plan's allocated part, the `auto` ones with kept
and offloaded layers within 0.2 %.

Offload (`true`) moves the saved tensors of every layer not kept to pinned host memory in the
forward and back in the backward, in place of the recompute; the trainer starts each layer's
copy back while the backward is still at the layer after it (`finetune_trainer.activations`).
`auto` turns it on where layers would still recompute, when the speed model says the copies
cost less than the recompute they replace (`speed.offload_stall_seconds`: what does not hide
under the neighbouring layers' compute), and when the pinned memory fits a pod whose
`resources.memory` is set.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from finetune_api.spec import TrainingSpec

from . import calibration as cal
from . import memory as mem
from .memory import GIB, Recipe
from .model_shape import ModelShape

Choice = bool | Literal["auto"]


@dataclass(frozen=True)
class ActivationAsk:
    """`training.gradientCheckpointing` and `training.activationOffload` as a spec says them: the
    one place `auto`, true and false are read (the planner's recipe, its sizing, the memory
    savers of a retry, the trainer's choice where no plan sizes the layers)."""

    checkpointing: Choice = "auto"
    offload: Choice = "auto"

    @classmethod
    def of(cls, training: TrainingSpec) -> ActivationAsk:
        """From a spec's `training` block."""
        return cls(training.gradient_checkpointing, training.activation_offload)

    @property
    def recomputes(self) -> bool:
        """Whether any layer may recompute: `auto` is planned all-recompute first, then sized."""
        return self.checkpointing is not False

    @property
    def recomputes_all(self) -> bool:
        """Every layer recomputes, none kept (`true`)."""
        return self.checkpointing is True

    @property
    def offloads(self) -> bool:
        """Every layer not kept offloads (`true`)."""
        return self.offload is True

    @property
    def may_offload(self) -> bool:
        """Offload may be chosen (`auto`) or is asked (`true`)."""
        return self.offload is not False

    @property
    def weighs_offload(self) -> bool:
        """`auto`: offload where the speed model says it pays and the host holds it."""
        return self.offload == "auto"


@dataclass(frozen=True)
class LayerLayout:
    """Which decoder layers keep, recompute or offload their activations: the plan's decision as
    the trainer applies it (`finetune_trainer.activations`). The last `kept` layers keep theirs;
    the `offloaded` just before them wait in pinned host memory; the first `recomputed` run their
    forward again in the backward, their inputs in host memory where `inputs_offloaded`."""

    kept: int
    recomputed: int
    offloaded: int
    inputs_offloaded: bool = False

    @classmethod
    def of(cls, shape: ModelShape, recipe: Recipe) -> LayerLayout:
        recomputed = mem.recomputed_layers(shape, recipe)
        inputs = mem.inputs_offloaded(recipe) and recomputed > 0
        return cls(mem.kept_layers(shape, recipe), recomputed, mem.offloaded_layers(shape, recipe), inputs)


@dataclass(frozen=True)
class Activations:
    """What the plan chose for the activations, and why, in words for `ftjob plan`."""

    recipe: Recipe  # with gradient_checkpointing, kept_layers and offload set
    checkpointing: str  # e.g. "recompute 20 of 32 layers (12 keep their activations)"
    offload: str  # why offload is on or off
    all_recompute_tokens_per_second: float | None = None


def roomy(headroom: float, loss_chunk_tokens: int, block: float) -> bool:
    """Whether a layout leaves the planner's margin: `cal.SHORT_HEADROOM_GIB`, plus one logits
    block for a whole-sequence loss."""
    return headroom >= cal.SHORT_HEADROOM_GIB * GIB + (0 if loss_chunk_tokens else block)


def most_kept(layers: int, fits: Callable[[int], bool]) -> int | None:
    """The most layers that may keep their activations (`fits(k)` grows false with k), or None
    when not even all-recompute fits."""
    return largest_fitting(0, layers, fits)


def largest_fitting(low: int, high: int, fits: Callable[[int], bool]) -> int | None:
    """The largest n in [low, high] with `fits(n)`, for a `fits` that turns false once and stays
    so (bisection); None when not even `low` fits."""
    if not fits(low):
        return None
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def describe(shape: ModelShape, recipe: Recipe, pinned_bytes: float) -> str:
    """`recompute 20 of 32 layers, offload 12 (12.0 GiB pinned host memory)` and the like."""
    layers = shape.layers
    recomputed = mem.recomputed_layers(shape, recipe)
    offloaded = mem.offloaded_layers(shape, recipe)
    kept = mem.kept_layers(shape, recipe)
    if not recipe.gradient_checkpointing:
        return f"no layer recomputes (all {layers} keep their activations)"
    parts = [f"recompute {recomputed} of {layers} layers"]
    if offloaded:
        parts.append(f"offload {offloaded} ({pinned_bytes / GIB:.1f} GiB pinned host memory)")
    if mem.inputs_offloaded(recipe) and recomputed:
        parts[0] += f" (their inputs in host memory: {pinned_bytes / GIB:.1f} GiB pinned)"
    parts.append(f"{kept} keep their activations")
    return ", ".join(parts)


def candidates(recipe: Recipe, chunks: Sequence[int], offload: bool) -> list[Recipe]:
    """The recipes `auto` sizes, one per loss chunk size, every layer checkpointed to start with."""
    return [
        replace(recipe, gradient_checkpointing=True, kept_layers=0, offload=offload, loss_chunk_tokens=c)
        for c in chunks
    ]

"""What the plan decided for the decoder layers' activations: typed, for the trainer to apply.

The trainer reads these fields, never the summary's words (tests/architecture/test_handoff.py):
`LayerLayout` is which layers keep, recompute or offload; `Activations` that choice with the
reasons `ftjob plan` prints (`recompute` decides it, `messages.activations` words it).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import memory as mem
from ..memory import Recipe
from ..model_shape import ModelShape


@dataclass(frozen=True)
class LayerLayout:
    """Which decoder layers keep, recompute or offload their activations: the plan's decision as
    the trainer applies it (`finetune_trainer.memory.activations`). The last `kept` layers keep theirs;
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
    # A choice the spec asked that the GPUs cannot hold (`training.keptLayers`): the plan's
    # refusal in one line naming the field; the plan does not fit.
    refusal: str | None = None

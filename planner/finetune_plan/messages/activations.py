"""The layers' activations in words: which layers recompute, offload or keep, and why offload is
on or off, as `ftjob plan` prints them on its `layers` and `offload` lines.

`recompute` decides; these are its reasons, one phrase per outcome, so that the same decision
always reads the same.
"""

from __future__ import annotations

from typing import Final

from .. import memory as mem
from ..host.limit import HostLimit
from ..memory import GIB, Recipe
from ..model_shape import ModelShape

# Why offload is off or on, where the reason needs no figure.
NO_LAYER_RECOMPUTES: Final = "off: no layer recomputes"
ASKED_ON: Final = "on (activationOffload: true)"
AUTO_NO_ROOM: Final = "off (auto): no room on the GPU for the layers in flight"


def layers_line(shape: ModelShape, recipe: Recipe, pinned_bytes: float) -> str:
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


def against_all_recompute(line: str, rate: float, baseline: float) -> str:
    """The layers' line with the plan's speed beside every layer recomputing."""
    return line + f"; {rate:,.0f} tokens/s against {baseline:,.0f} all-recompute"


def all_recompute(layers: int) -> str:
    """The layers' line where not one layer more than all-recompute fits the margin."""
    return f"recompute all {layers} layers: the plan leaves no room for one more beyond the margin"


def _asked(offload: bool | str) -> str:
    """`training.activationOffload` as the spec writes it: true, false, auto or inputs."""
    return str(offload).lower()


def asked(offload: bool | str) -> str:
    """Offload as asked, where every layer recomputes (`gradientCheckpointing: true`)."""
    return ASKED_ON if offload is True else f"off (activationOffload: {_asked(offload)})"


def inputs_only(offload: bool | str) -> str:
    """Only the recomputing layers' inputs wait in host memory: asked (`inputs`), or because the
    GPUs need the room."""
    if offload == "inputs":
        return "the recomputing layers' inputs only (activationOffload: inputs)"
    return f"the recomputing layers' inputs only (activationOffload: {_asked(offload)}): what fits the GPUs"


def no_room(wanted: bool) -> str:
    """Where not one layer more than all-recompute fits (`wanted`: offload was asked)."""
    return "off: no room for the layer in flight" if wanted else "off: every layer recomputes"


def not_weighed(offload: bool | str, recomputes: bool, *, kept_asked: bool = False) -> str:
    """Offload off without weighing it: asked false or inputs, the layers kept named by the spec
    (`kept_asked`: training.keptLayers), or nothing it could replace."""
    asked_words = "" if offload == "auto" else f" (activationOffload: {_asked(offload)})"
    if kept_asked and offload == "auto":
        asked_words = " (auto): training.keptLayers names the layers kept"
    return "off" + asked_words + (": no layer recomputes" if not recomputes else "")


def kept_refused(asked: int, most: int | None, where: str) -> str:
    """`training.keptLayers` above what the GPUs hold with the planner's margin: the plan's refusal."""
    fit = "not even every layer recomputing fits" if most is None else f"at most {most} fit"
    return (
        f"training.keptLayers: {asked} layers keeping their activations do not fit on {where} with the planner's "
        f"margin; {fit} (unset keptLayers for the planner to size them)"
    )


def not_one_layer(pinned_layer: float, limit: HostLimit) -> str:
    """`auto` off: one layer's pinned activations are already above the pod's host memory."""
    return (
        f"off (auto): not one layer's {pinned_layer / GIB:.1f} GiB, pinned in each process, fits "
        f"{limit.describe()} with the rest of the pod"
    )


def capped(layers: int, limit: HostLimit) -> str:
    """`auto` on for fewer layers than the GPUs allow: what the pod's host memory holds."""
    return f", {layers} layers: what fits {limit.describe()}"


def weighed(on: bool, *, capped: str, offloaded_rate: float, rate: float, recomputing: bool) -> str:
    """`auto`'s verdict from the speed model: offloading at `offloaded_rate` against `rate`
    recomputing (or, `recomputing` false, keeping every layer with the loss in chunks)."""
    instead = "recomputing" if recomputing else "keeping every layer, the loss in chunks"
    figures = f"{offloaded_rate:,.0f} tokens/s with it against {rate:,.0f} {instead}"
    if not on:
        return f"off (auto): {figures}"
    return f"on (auto{capped}): {figures}, the copy back a layer ahead of the backward"

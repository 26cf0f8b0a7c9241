"""The micro-batch in one pass: the best layout, or where that does not fit and every layer may
recompute, the recomputing layers' inputs in host memory.

What a recomputing layer keeps, its input, can wait in host memory instead: the GPUs then hold two
such inputs, not one per layer (80 of a 70B at 2048 tokens: 5.1 GiB per GPU). The copies hide
under compute, so this saver comes before any that costs time; it is taken where it fits the GPUs
and the pod's host memory (`host.budget`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..host.budget import allows
from ..host.limit import HostLimit
from ..host.need import pod_bytes
from ..memory import Recipe
from ..messages.host import inputs_refusal
from ..model_shape import ModelShape
from ..results.layout import Hardware, Layout
from ..speed import Mode
from .best import best_layout

# The recipe as planned, its closest layout, each mode's best, and the one-line refusal of the
# recomputing layers' inputs in host memory where only the host's memory stood in the way.
Found = tuple[Recipe, Layout, list[Layout], str | None]


@dataclass(frozen=True)
class Fit:
    """What a layout is sought among: the modes, the loss chunks, the pod's host memory."""

    modes: list[Mode]
    chunks: Sequence[int]
    host_limit: HostLimit | None


def inputs_in_host(
    shape: ModelShape, recipe: Recipe, hardware: Hardware, found: tuple[Layout, list[Layout]], fit: Fit
) -> Found:
    """The recipe and layouts with the recomputing layers' inputs in host memory where that fits
    the GPUs and the host, else `found` as it was, with the one-line refusal where only the
    host's memory stood in the way."""
    inputs = replace(recipe, offload_inputs=True)
    held = best_layout(shape, inputs, hardware, fit.modes, fit.chunks)
    if held[0].fits and allows(shape, inputs, held[0].mode, hardware.gpus, fit.host_limit):
        return inputs, held[0], held[1], None
    if held[0].fits and fit.host_limit is not None:
        need = pod_bytes(shape, inputs, held[0].mode, hardware.gpus)
        return recipe, found[0], found[1], inputs_refusal(need, fit.host_limit)
    return recipe, found[0], found[1], None


def one_pass(
    shape: ModelShape, recipe: Recipe, hardware: Hardware, found: tuple[Layout, list[Layout]], fit: Fit, *, holds: bool
) -> Found:
    """`found`, or where it does not fit and every layer may recompute with `holds`, the
    recomputing layers' inputs in host memory (`inputs_in_host`)."""
    if found[0].fits or not holds or not recipe.gradient_checkpointing:
        return recipe, found[0], found[1], None
    return inputs_in_host(shape, recipe, hardware, found, fit)

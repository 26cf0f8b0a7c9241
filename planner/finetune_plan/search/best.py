"""Of the modes and loss chunk sizes, the layout that fits and runs fastest.

Each mode keeps its safest layout of the chunk sizes (`safest`), and of those that fit the
fastest wins; where none fits, the one closest to fitting, with each mode's best beside it for
`ftjob plan` to show (`alternatives`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .. import memory as mem
from ..layouts.mode import layout_for
from ..memory import Recipe
from ..model_shape import ModelShape
from ..recompute.kept import tokens_per_second
from ..results.layout import Hardware, Layout
from ..speed import Mode
from .modes import ALL_MODES, ModeChoice


def safest(tried: Sequence[Layout], shape: ModelShape, recipe: Recipe) -> Layout:
    """Of one mode's layouts (one per loss chunk size, in the trainer's order), the first that fits
    with room to spare, else a fitting one with the loss in chunks, else the first that fits, else
    the closest to fitting. The chunked loss keeps the math; a whole-sequence loss needs a spare
    logits block besides (`Layout.leaves_margin`), and every plan `cal.SHORT_HEADROOM_GIB`."""
    fitting = [t for t in tried if t.fits]
    if not fitting:
        return min(tried, key=lambda t: t.shortfall)
    block = mem.logits_block_bytes(shape, recipe)
    chunked = [t for t in fitting if t.loss_chunk_tokens]
    return next((t for t in fitting if t.leaves_margin(block)), chunked[0] if chunked else fitting[0])


def best_layout(
    shape: ModelShape, recipe: Recipe, hw: Hardware, modes: Sequence[Mode], loss_chunks: Sequence[int]
) -> tuple[Layout, list[Layout]]:
    """The fastest layout that fits, else the one closest to fitting; plus each mode's best."""
    per_mode: list[Layout] = []
    for mode in modes:
        tried = [layout_for(mode, shape, replace(recipe, loss_chunk_tokens=c), hw) for c in loss_chunks]
        per_mode.append(safest(tried, shape, recipe))
    fitting = [layout for layout in per_mode if layout.fits]
    if fitting:

        def rate(layout: Layout) -> float:
            r = replace(recipe, loss_chunk_tokens=layout.loss_chunk_tokens)
            return tokens_per_second(shape, r, hw, layout.mode)

        return max(fitting, key=rate), per_mode
    return min(per_mode, key=lambda t: t.shortfall), per_mode


def fits_in(shape: ModelShape, recipe: Recipe, hw: Hardware, modes: Sequence[Mode], chunks: Sequence[int]) -> bool:
    """Whether any of `modes` fits the recipe on `hw` with one of the loss chunks."""
    return best_layout(shape, recipe, hw, modes, chunks)[0].fits


def alternatives(
    shape: ModelShape,
    recipe: Recipe,
    hardware: Hardware,
    layout: Layout,
    per_mode: list[Layout],
    *,
    mode: ModeChoice,
    modes: list[Mode],
    chunks: Sequence[int],
) -> tuple[Layout, ...]:
    """The layouts `ftjob plan` sets beside the chosen one: every mode `auto` weighed, or the asked
    mode and the modes it did not weigh."""
    if mode == "auto" and hardware.gpus > 1:
        return tuple(per_mode)
    others = (
        tuple(best_layout(shape, recipe, hardware, [m], chunks)[0] for m in ALL_MODES if m not in modes)
        if hardware.gpus > 1
        else ()
    )
    return (layout, *others)

"""How many layers keep their activations: the most that leave the planner's margin, of the loss
chunk sizes the one that runs fastest.

Every layer is checkpointed to start with (`candidates`); the layers kept are then bisected
(`most_kept`: a layer more never needs less memory), and of the chunk sizes the sizing that the
speed model says is fastest wins (`sized`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from .. import memory as mem
from ..bisection import largest_fitting
from ..grpo.timing import estimate
from ..layouts.mode import layout_for
from ..memory import Recipe
from ..model_shape import ModelShape
from ..results.layout import Hardware, Layout
from ..speed import Mode


def tokens_per_second(shape: ModelShape, recipe: Recipe, hw: Hardware, mode: Mode) -> float:
    """The speed model's rate for `recipe` in `mode` on `hw`: what the sizing and the search weigh."""
    return estimate(shape, recipe, hw.product, gpus=hw.gpus, mode=mode).tokens_per_second


def most_kept(layers: int, fits: Callable[[int], bool]) -> int | None:
    """The most layers that may keep their activations (`fits(k)` grows false with k), or None
    when not even all-recompute fits."""
    return largest_fitting(0, layers, fits)


def candidates(recipe: Recipe, chunks: Sequence[int], offload: bool) -> list[Recipe]:
    """The recipes `auto` sizes, one per loss chunk size, every layer checkpointed to start with."""
    return [
        replace(recipe, gradient_checkpointing=True, kept_layers=0, offload=offload, loss_chunk_tokens=c)
        for c in chunks
    ]


def sized(
    shape: ModelShape, recipe: Recipe, hw: Hardware, mode: Mode, *, chunks: Sequence[int], offload: bool
) -> tuple[Layout, Recipe] | None:
    """`auto`: of the loss chunk sizes, the layout with the most layers kept under the margin
    that runs fastest; None when even all-recompute leaves no margin."""
    block = mem.logits_block_bytes(shape, recipe)
    best: tuple[float, Layout, Recipe] | None = None
    for start in candidates(recipe, chunks, offload):

        def layout_keeping(kept: int, start: Recipe = start) -> Layout:
            return layout_for(mode, shape, replace(start, kept_layers=kept), hw)

        def fits(kept: int) -> bool:
            return layout_keeping(kept).leaves_margin(block)

        kept = most_kept(shape.layers, fits)
        if kept is None:
            continue
        chosen = replace(start, kept_layers=kept)
        rate = tokens_per_second(shape, chosen, hw, mode)
        if best is None or rate > best[0]:
            best = (rate, layout_keeping(kept), chosen)
    return None if best is None else (best[1], best[2])

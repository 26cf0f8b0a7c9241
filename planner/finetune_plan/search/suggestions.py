"""What would fit, where nothing does: more GPUs, a shorter maxLength, a micro-batch of one row,
gradient checkpointing, GRPO's fewer completions per prompt, each found by the same search in the
mode asked for (auto: any allowed).

More GPUs never need more memory per GPU, and a shorter sequence or a smaller group never needs
more memory, so the fewest GPUs, the longest maxLength and the most completions per prompt that
fit are bisected (`bisection`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from .. import memory as mem
from .. import pairs
from ..bisection import largest_fitting, smallest_fitting
from ..grpo.spec import with_terms
from ..memory import Recipe
from ..messages import suggestions as say
from ..model_shape import ModelShape
from ..results.layout import Hardware, Layout
from ..speed import Mode
from .best import best_layout, fits_in
from .modes import ModeChoice, modes_for

MAX_GPUS: Final = 64
SHORTEST: Final = 16
FEWEST_GENERATIONS: Final = 2  # a GRPO group of one has no spread to learn from


def _more_gpus(
    shape: ModelShape,
    recipe: Recipe,
    hw: Hardware,
    *,
    choice: ModeChoice,
    allowed: Sequence[Mode],
    chunks: Sequence[int],
) -> str:
    """The fewest GPUs of the product that fit, up to MAX_GPUS."""

    def layout_on(gpus: int) -> Layout:
        more = hw.with_gpus(gpus)
        return best_layout(shape, recipe, more, modes_for(choice, more, allowed), chunks)[0]

    if hw.gpus < MAX_GPUS and layout_on(MAX_GPUS).fits:
        fewest = smallest_fitting(hw.gpus + 1, MAX_GPUS, lambda gpus: layout_on(gpus).fits)
        return say.more_gpus(fewest, hw.product.name, layout_on(fewest).mode)
    return say.no_gpu_count(MAX_GPUS, hw.product.name, recipe.max_length)


def _shorter(shape: ModelShape, recipe: Recipe, hw: Hardware, modes: list[Mode], chunks: Sequence[int]) -> list[str]:
    """The longest maxLength below the recipe's that fits these GPUs, or why none does (GRPO's
    above its maxCompletionLength, which a row must leave a prompt beside)."""
    high = recipe.max_length - 1
    shortest = SHORTEST if recipe.grpo is None else max(SHORTEST, recipe.grpo.max_completion_length + 1)
    if high < shortest:
        return []

    def fits(length: int) -> bool:
        return fits_in(shape, replace(recipe, max_length=length), hw, modes, chunks)

    longest = largest_fitting(shortest, high, fits)
    if longest is not None:
        return [say.shorter(hw.gpus, hw.product.name, longest)]
    weights = shape.layers * mem.layer_weight_bytes(shape, recipe) + mem.embedding_bytes(shape, recipe)
    weights += mem.head_bytes(shape)
    fullest = best_layout(shape, replace(recipe, max_length=shortest), hw, modes, chunks)[0].fullest
    line = say.no_length(
        hw.gpus,
        hw.product.name,
        weights=weights,
        memory_gib=hw.memory_gib,
        shortest=shortest,
        gpu=fullest.index,
        needs=fullest.total,
    )
    return [line]


def _fewer_generations(
    shape: ModelShape, recipe: Recipe, hw: Hardware, modes: list[Mode], chunks: Sequence[int]
) -> list[str]:
    """GRPO: the most completions per prompt below the recipe's that fit these GPUs (fewer rows in
    the rollouts' cache and in the scored micro-batch), where any does."""
    terms = recipe.grpo
    if terms is None or terms.num_generations <= FEWEST_GENERATIONS:
        return []

    def fits(generations: int) -> bool:
        fewer = with_terms(recipe, replace(terms, num_generations=generations))
        return fits_in(shape, fewer, hw, modes, chunks)

    most = largest_fitting(FEWEST_GENERATIONS, terms.num_generations - 1, fits)
    return [] if most is None else [say.fewer_generations(hw.gpus, hw.product.name, most)]


def suggestions(
    shape: ModelShape,
    recipe: Recipe,
    hw: Hardware,
    *,
    choice: ModeChoice,
    allowed: Sequence[Mode],
    chunks: Sequence[int],
) -> list[str]:
    """What would fit, in the mode asked for (auto: any allowed mode)."""
    out = [_more_gpus(shape, recipe, hw, choice=choice, allowed=allowed, chunks=chunks)]
    modes = modes_for(choice, hw, allowed)
    out += _shorter(shape, recipe, hw, modes, chunks)
    out += _fewer_generations(shape, recipe, hw, modes, chunks)
    if recipe.rows > 1 and fits_in(shape, pairs.with_rows(recipe, 1), hw, modes, chunks):
        out.append(say.BATCH_ONE)
    if not recipe.gradient_checkpointing and fits_in(
        shape, replace(recipe, gradient_checkpointing=True), hw, modes, chunks
    ):
        out.append(say.CHECKPOINTING)
    return out

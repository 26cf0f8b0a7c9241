"""The longest sequence each parallelism mode fits: what `ftjob plan` answers when a user asks
how long a context the GPUs hold (the attention kernel decides much of it: a materialised
matrix grows with the square of the sequence, the fused kernel's memory with the sequence).

Pure: bisection over `search.best.fits_in`, the check `choose()` itself decides with, on the recipe as
planned (checkpointing `auto` plans all-recompute first, so the longest is where every layer
recomputes; kept layers only fill what is left).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from .bisection import largest_fitting
from .memory import Recipe
from .model_shape import ModelShape
from .results.layout import Hardware
from .search.best import fits_in
from .search.modes import ALL_MODES
from .speed import Mode

SHORTEST: Final = 16
LONGEST: Final = 131072


def longest_max_length(
    shape: ModelShape, recipe: Recipe, hw: Hardware, mode: Mode, *, chunks: Sequence[int], most: int = LONGEST
) -> int:
    """The largest maxLength at which `mode` fits (the recipe's batch); 0 when not even SHORTEST does."""

    def fits(length: int) -> bool:
        return fits_in(shape, replace(recipe, max_length=length, kept_layers=0), hw, [mode], chunks)

    return largest_fitting(SHORTEST, most, fits) or 0


def longest_per_mode(
    shape: ModelShape, recipe: Recipe, hw: Hardware, chunks: Sequence[int], allowed: Sequence[Mode] = ALL_MODES
) -> dict[Mode, int]:
    """Each mode's longest maxLength on this hardware (one GPU: one process, whatever the mode)."""
    modes = [m for m in ALL_MODES if m in allowed]
    if hw.gpus == 1:
        modes = modes[:1]
    return {mode: longest_max_length(shape, recipe, hw, mode, chunks=chunks) for mode in modes}

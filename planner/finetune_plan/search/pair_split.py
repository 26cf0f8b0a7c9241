"""Where one pass of the micro-batch fits no way, the pair split: a row's sequences (a preference
pair's chosen and rejected) through the model one pass each (`pairs`).

The split comes after every saver that keeps one pass (all layers recomputing, their inputs in
host memory: copies that hide under compute) and before the verdict that nothing fits: it costs
one more forward of every sequence, about what recomputing every layer costs, so it is taken only
where nothing else fits. The layers kept are then sized on the split micro-batch, as on any other.
A split that does not fit either is still the closest the plan comes: the verdict and its
suggestions are of it (a refusal of the unsplit inputs in host memory is moot: the split holds
fewer of them).
"""

from __future__ import annotations

from dataclasses import replace

from .. import pairs
from ..memory import Recipe
from ..model_shape import ModelShape
from ..results.layout import Hardware, Layout
from .best import best_layout
from .one_pass import Fit, Found, one_pass


def fitted(
    shape: ModelShape, recipe: Recipe, hardware: Hardware, fit: Fit, *, holds: bool, may_split: bool = True
) -> tuple[Layout | None, Found]:
    """The recipe as planned, its closest layout and each mode's, and the refusal of its
    recomputing layers' inputs in host memory where the host alone stood in the way (`holds`:
    they may wait there). First the micro-batch in one pass (`one_pass`); where that fits no way,
    the pair split where `may_split` (`training.pairSplit: auto`), with first the closest the
    unsplit micro-batch came (None: no split)."""
    found = best_layout(shape, recipe, hardware, fit.modes, fit.chunks)
    recipe, unsplit, per_mode, refused = one_pass(shape, recipe, hardware, found, fit, holds=holds)
    if unsplit.fits or not may_split or not pairs.splittable(recipe):
        return None, (recipe, unsplit, per_mode, refused)
    if holds and recipe.gradient_checkpointing:
        held = best_layout(shape, replace(recipe, offload_inputs=True), hardware, fit.modes, fit.chunks)[0]
        unsplit = min((unsplit, held), key=lambda t: t.shortfall)
    split = pairs.split(recipe)
    found = best_layout(shape, split, hardware, fit.modes, fit.chunks)
    return unsplit, one_pass(shape, split, hardware, found, fit, holds=holds)

"""GRPO's settings as the planner reads them: `training.grpo` to `GrpoTerms`, and the recipe of a
GRPO job (`inputs.recipe_from_spec` asks here for every spec).

The planner's own term, not the objective entry's: a GRPO row is one prompt but batchSize x G
sequences go through the scored forward and backward, and the reference forward runs only where
beta > 0, which no fixed entry of the objectives registry can say.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Final

from finetune_api.spec import TrainingSpec

from ..memory import GrpoTerms, Recipe

METHOD: Final = "grpo"


def terms_of(training: TrainingSpec) -> GrpoTerms | None:
    """GRPO's terms of a spec's `training` (its settings block, the defaults where unset); None
    for another method."""
    if training.method != METHOD:
        return None
    block = training.method_settings
    values = {} if block is None else block.model_dump(by_alias=False)
    return GrpoTerms(**{f.name: values[f.name] for f in fields(GrpoTerms) if f.name in values})


def with_terms(recipe: Recipe, terms: GrpoTerms | None) -> Recipe:
    """`recipe` (one sequence a row) as GRPO's: each of the micro-batch's prompts a row of G
    sequences through the scored pass, a reference forward of each where beta > 0; `recipe`
    itself for another method (`terms` None)."""
    if terms is None:
        return recipe
    rows = recipe.batch_size // max(1, recipe.sequences_per_row)
    return replace(
        recipe,
        batch_size=rows * terms.num_generations,
        sequences_per_row=terms.num_generations,
        sequence_names=(),
        pair_split=False,
        reference_forwards=1 if terms.beta > 0 else 0,
        grpo=terms,
    )

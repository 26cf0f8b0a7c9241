"""A row of several sequences (a preference pair: chosen and rejected) through the model: all in
one forward and backward, or one pass per sequence when memory needs it (the pair split).

Unsplit, a micro-batch of B pairs is one forward and backward of 2 x B sequences: the most
activations, the fewest passes. Split, the chosen B sequences go through, then the rejected B:
half the activations and the loss's logits, at the cost of one more forward of each sequence
without gradients (the loss of a pair needs both sides' log-probabilities before either side's
gradient: `finetune_trainer.objectives.preference` runs each side once without gradients, then
once with). Only an objective that names its sequences (`Objective.sequence_names`) splits.
The search takes the split only where one pass fits no way (`search.pair_split`); these are the
recipe's two shapes and their words, which the plan's records and `ftjob plan` print.
"""

from __future__ import annotations

from dataclasses import replace

from .memory import Recipe


def splittable(recipe: Recipe) -> bool:
    """Whether the recipe's rows may go through one pass per sequence and do not yet."""
    return recipe.sequences_per_row > 1 and bool(recipe.sequence_names) and not recipe.pair_split


def split(recipe: Recipe) -> Recipe:
    """`recipe` with each row's sequences in passes of their own: each pass holds the rows alone."""
    return replace(recipe, batch_size=recipe.rows, pair_split=True)


def with_rows(recipe: Recipe, rows: int) -> Recipe:
    """`recipe` with a micro-batch of `rows` rows (`training.batchSize`), split as it is."""
    return replace(recipe, batch_size=rows * (1 if recipe.pair_split else recipe.sequences_per_row))


def _sequences(count: int) -> str:
    return f"{count} sequence" + ("" if count == 1 else "s")


def describe(recipe: Recipe) -> str | None:
    """`chosen and rejected in one micro-batch of 2 x 4 sequences` and the like; None for an
    objective whose rows are one sequence, and for GRPO's groups (`grpo` says them)."""
    if recipe.sequences_per_row <= 1 or recipe.grpo is not None:
        return None
    count = recipe.sequences_per_row
    names = recipe.sequence_names
    sides = f"{', '.join(names[:-1])} and {names[-1]}" if len(names) == count else f"a row's {count} sequences"
    if not recipe.pair_split:
        return f"{sides} in one micro-batch of {count} x {recipe.rows} sequences"
    passes = "two" if count == 2 else str(count)
    return f"{sides} in {passes} micro-batches of {_sequences(recipe.batch_size)} each"

"""The loss chunk sizes a plan tries: the logits of the whole sequence at once, else in chunks.

A whole-sequence loss holds seq x vocab FP32 logits (three copies: 2.9 GiB for 2048 tokens of a
128256 vocabulary); in chunks of LOSS_CHUNK_TOKENS inside the LM head it holds one chunk's, at
the cost of the head's forward once more. The math is the same either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from ..memory import Recipe

# Chunk of tokens per loss step when the full-sequence logits do not fit.
LOSS_CHUNK_TOKENS: Final = 512


def chunks_to_try(recipe: Recipe, loss_chunks: Sequence[int] | None) -> list[int]:
    """The loss chunk sizes to try in order: as given, else the recipe's, else the whole sequence
    then chunks of LOSS_CHUNK_TOKENS."""
    if loss_chunks is not None:
        return list(loss_chunks)
    return [recipe.loss_chunk_tokens] if recipe.loss_chunk_tokens else [0, LOSS_CHUNK_TOKENS]

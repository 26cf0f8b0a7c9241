"""What would fit instead, in words: the lines a plan that does not fit ends its verdict with.

The search (`search.suggestions`) finds the figures: the fewest GPUs, the longest maxLength, a
micro-batch of one row, gradient checkpointing, GRPO's fewest completions per prompt; these are
the sentences, each naming the field to change.
"""

from __future__ import annotations

from typing import Final

from finetune_api.modes import to_spec

from ..memory import GIB
from ..speed import Mode
from .figures import gib

BATCH_ONE: Final = "fits with batchSize 1 (raise gradientAccumulation to keep the effective batch)"
CHECKPOINTING: Final = "fits with gradientCheckpointing: true"


def more_gpus(gpus: int, product: str, mode: Mode) -> str:
    return f"fits on {gpus} x {product} ({to_spec(mode)} mode)"


def no_gpu_count(most: int, product: str, max_length: int) -> str:
    return f"does not fit on up to {most} x {product} at maxLength {max_length}"


def shorter(gpus: int, product: str, max_length: int) -> str:
    return f"fits on {gpus} x {product} with maxLength <= {max_length}"


def fewer_generations(gpus: int, product: str, generations: int) -> str:
    return f"fits on {gpus} x {product} with training.grpo.numGenerations <= {generations}"


def no_length(
    gpus: int, product: str, *, weights: float, memory_gib: float, shortest: int, gpu: int, needs: float
) -> str:
    """Not even the shortest maxLength fits: the weights' share of the GPUs, and what the fullest
    GPU still needs at `shortest` tokens."""
    return (
        f"no maxLength fits on {gpus} x {product} (the weights alone take "
        f"{weights / GIB:.1f} of {gpus * memory_gib:.1f} GiB; at maxLength {shortest} GPU "
        f"{gpu} still needs {gib(needs)})"
    )

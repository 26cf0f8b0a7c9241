"""Which micro-batches a rank trains on.

Global micro-batch `i` of optimizer step `s` (with `per_step` micro-batches per step in total)
goes to rank `i % world_size`. Because the split is by global index, a checkpoint's data
position (`micro-batches consumed`) means the same thing on any GPU count, so a job can resume
on a different number of GPUs.
"""

from __future__ import annotations


def micro_batches_per_rank(global_per_step: int, world_size: int) -> int:
    """Micro-batches each rank runs per optimizer step; the global count must split evenly."""
    if global_per_step < world_size or global_per_step % world_size:
        raise ValueError(
            f"gradient accumulation x GPUs must be a multiple of the GPU count: "
            f"{global_per_step} micro-batches per step cannot be split over {world_size} GPUs"
        )
    return global_per_step // world_size


def rank_indices(step: int, global_per_step: int, rank: int, world_size: int) -> list[int]:
    """Global micro-batch indices that `rank` runs in optimizer step `step` (0-based)."""
    micro_batches_per_rank(global_per_step, world_size)
    first = step * global_per_step
    return [first + i for i in range(global_per_step) if i % world_size == rank]

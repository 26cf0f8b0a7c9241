"""Every global micro-batch is trained exactly once, whatever the GPU count."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from finetune_trainer.distributed.shards import micro_batches_per_rank, rank_indices


@given(world=st.integers(1, 8), per_rank=st.integers(1, 8), step=st.integers(0, 1000))
def test_ranks_split_each_step_without_overlap_or_gap(world: int, per_rank: int, step: int) -> None:
    total = world * per_rank
    seen = [i for rank in range(world) for i in rank_indices(step, total, rank, world)]
    assert sorted(seen) == list(range(step * total, (step + 1) * total))
    assert all(len(rank_indices(step, total, r, world)) == per_rank for r in range(world))


def test_position_means_the_same_on_another_gpu_count() -> None:
    # 8 micro-batches per step: step 3 covers global indices 24..31 on 1, 2 or 4 GPUs alike.
    for world in (1, 2, 4):
        covered = sorted(i for r in range(world) for i in rank_indices(3, 8, r, world))
        assert covered == list(range(24, 32))


def test_uneven_split_is_refused_with_the_numbers() -> None:
    with pytest.raises(ValueError, match="6 micro-batches per step cannot be split over 4 GPUs"):
        micro_batches_per_rank(6, 4)

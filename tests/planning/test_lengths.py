"""The longest sequence each mode fits (`finetune_plan.lengths`, `ftjob plan`'s `longest` line):
the bisection's answer fits and one token more does not, and the fused attention, whose memory
grows with the sequence and not its square, fits longer sequences than the materialised matrix."""

from dataclasses import replace

import pytest

from finetune_plan import Hardware, Recipe, lookup, shape_from_config
from finetune_plan.lengths import longest_max_length, longest_per_mode
from finetune_plan.parallelism import TRAINER_LOSS_CHUNKS
from finetune_plan.search.best import fits_in

from .models import LLAMA_3_8B, LLAMA_33_70B

P40 = lookup("Tesla-P40")
assert P40 is not None
CHUNKS = TRAINER_LOSS_CHUNKS


@pytest.mark.parametrize(
    ("config", "gpus", "mode"),
    [(LLAMA_3_8B, 1, "device_map"), (LLAMA_33_70B, 4, "fsdp"), (LLAMA_33_70B, 4, "device_map")],
)
def test_the_longest_fits_and_one_token_more_does_not(config: dict, gpus: int, mode: str) -> None:
    assert P40 is not None
    shape, hw = shape_from_config(config), Hardware(gpus, P40, P40.memory_gib)
    recipe = Recipe(attention="memory_efficient")
    longest = longest_max_length(shape, recipe, hw, mode, chunks=CHUNKS)  # type: ignore[arg-type]
    assert longest > 0
    assert fits_in(shape, replace(recipe, max_length=longest), hw, [mode], CHUNKS)  # type: ignore[list-item]
    assert not fits_in(shape, replace(recipe, max_length=longest + 1), hw, [mode], CHUNKS)  # type: ignore[list-item]


def test_the_fused_attention_fits_longer_sequences_than_the_materialised_matrix() -> None:
    assert P40 is not None
    shape, hw = shape_from_config(LLAMA_3_8B), Hardware(1, P40, P40.memory_gib)
    fused = longest_per_mode(shape, Recipe(attention="memory_efficient"), hw, CHUNKS)
    matrix = longest_per_mode(shape, Recipe(attention="materialised"), hw, CHUNKS)
    assert list(fused) == list(matrix) and len(fused) == 1  # one GPU: one process, one answer
    (mode,) = fused
    assert fused[mode] >= 2 * matrix[mode] and fused[mode] >= 8192


def test_modes_that_fit_nothing_say_zero() -> None:
    assert P40 is not None
    shape, hw = shape_from_config(LLAMA_33_70B), Hardware(4, P40, P40.memory_gib)
    found = longest_per_mode(shape, Recipe(attention="memory_efficient"), hw, CHUNKS)
    assert found["data_parallel"] == 0  # a whole 70B on each P40: no length fits
    assert found["device_map"] > found["fsdp"] > 0

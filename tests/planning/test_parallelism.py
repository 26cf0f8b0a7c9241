"""`choose()`: the mode and process count the trainer launches, the same call `ftjob plan` makes."""

from dataclasses import replace
from typing import Any

import pytest

from finetune_api import parse_file
from finetune_api.spec import FineTuneJobSpec
from finetune_plan import (
    GIB,
    TRAINER_LOSS_CHUNKS,
    Hardware,
    LaunchPlan,
    ModelConfigError,
    choose,
    known_model,
    lookup,
    shape_from_config,
)
from finetune_plan.inputs import recipe_from_spec
from finetune_plan.layouts.fsdp import fsdp_layout
from tests.planning.models import EXAMPLE

from .models import LLAMA_3_8B, LLAMA_33_70B

P40_BYTES = int(22.4 * GIB)
# The issue's "larger than one card" slice: 70B-shaped layers, 40 of them.
SLICE_40 = {**LLAMA_33_70B, "num_hidden_layers": 40}


def example_spec(**changes: Any) -> FineTuneJobSpec:
    """The 70B-on-4-P40 example's spec, with training/resources fields changed."""
    job = parse_file(EXAMPLE)[0].job
    assert job is not None
    spec = job.spec
    training = {k: v for k, v in changes.items() if k in type(spec.training).model_fields}
    resources = {k: v for k, v in changes.items() if k in type(spec.resources).model_fields}
    assert len(training) + len(resources) == len(changes), changes
    return spec.model_copy(
        update={
            "training": spec.training.model_copy(update=training),
            "resources": spec.resources.model_copy(update=resources),
        }
    )


def launch(spec: FineTuneJobSpec, config: dict[str, Any] | None, gpus: int, **kwargs: Any) -> LaunchPlan:
    return choose(spec, config, gpus, P40_BYTES if gpus else None, "Tesla P40" if gpus else None, **kwargs)


# --- the CPU -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parallelism", "processes", "expected"),
    [
        ("auto", None, ("dataParallel", 1)),
        ("auto", 3, ("dataParallel", 3)),
        ("fsdp", 2, ("fsdp", 2)),
        ("dataParallel", None, ("dataParallel", 1)),
        ("deviceMap", None, ("deviceMap", 1)),
    ],
)
def test_cpu_takes_the_spec_and_plans_no_memory(parallelism: str, processes: int | None, expected: tuple[str, int]):
    spec = example_spec(gpus=0, parallelism=parallelism, processes=processes)
    result = launch(spec, None, 0)
    assert (result.parallelism, result.processes) == expected
    assert result.plan is None and result.fits


def test_cpu_needs_no_model_config_but_gpus_do():
    assert launch(example_spec(gpus=0), None, 0).plan is None
    with pytest.raises(ModelConfigError):
        launch(example_spec(), None, 4)


def test_an_unreadable_model_config_raises_model_config_error():
    with pytest.raises(ModelConfigError, match="num_attention_heads"):
        launch(example_spec(), {"hidden_size": 8}, 2)


# --- GPUs, auto ----------------------------------------------------------------------------


def test_one_gpu_is_data_parallel_of_one():
    result = launch(example_spec(), LLAMA_3_8B, 1)
    assert (result.parallelism, result.processes) == ("dataParallel", 1)
    assert result.plan is not None and result.plan.fits and result.plan.parallelism == "dataParallel"


@pytest.mark.parametrize("gpus", [2, 4])
def test_a_model_that_fits_one_gpu_runs_data_parallel_on_every_gpu(gpus: int):
    result = launch(example_spec(), LLAMA_3_8B, gpus)
    assert (result.parallelism, result.processes) == ("dataParallel", gpus)
    assert result.plan is not None and result.plan.fits
    assert result.plan.speed is not None
    one = launch(example_spec(), LLAMA_3_8B, 1).plan
    assert one is not None and one.speed is not None
    assert result.plan.speed.tokens_per_second == pytest.approx(gpus * one.speed.tokens_per_second)


def test_a_model_larger_than_one_gpu_is_sharded_with_fsdp():
    """Hand arithmetic: 40 layers of the 70B shape hold 855,638,016 NF4 parameters each at
    0.5 + 1/64 + 4/(64 x 256) bytes (441,397,248 bytes), 16.4 GiB, and the fp32 embeddings and
    head 2 x 128256 x 8192 x 4 bytes, 7.8 GiB: 24.3 GiB before any activation, more than one
    22.4 GiB P40, less than two. The mode chosen (fsdp over 2 processes) is a regression pin."""
    by_hand = (40 * 855_638_016 * (0.5 + 1 / 64 + 4 / (64 * 256)) + 2 * 128256 * 8192 * 4) / GIB
    assert 22.4 < by_hand < 2 * 22.4
    result = launch(example_spec(), SLICE_40, 2)
    assert (result.parallelism, result.processes) == ("fsdp", 2)
    assert result.plan is not None and result.plan.fits
    single = launch(example_spec(), SLICE_40, 1)
    assert single.plan is not None and not single.plan.fits


def test_regression_pin_70b_on_four_p40s_fits_in_the_mode_the_attention_allows():
    """Regression pin of today's planner, derived from nothing else: the example's 2048 tokens fit
    fsdp with the fused attention, the recomputing layers' inputs in host memory (activationOffload
    auto; 80 inputs on the GPU would not fit), with over 1 GiB per P40 to spare; every input kept
    on the GPU leaves no fit in the modes auto may choose, and the materialised matrix less room;
    1664 tokens fit either way; deviceMap comes only when asked."""
    shorter = [
        launch(example_spec(max_length=1664), LLAMA_33_70B, 4, attention=a)
        for a in ("materialised", "memory_efficient")
    ]
    assert all(x.fits and (x.parallelism, x.processes) == ("fsdp", 4) for x in shorter)
    assert shorter[0].plan is not None and shorter[0].plan.recipe.loss_chunk_tokens in TRAINER_LOSS_CHUNKS
    longer = launch(example_spec(), LLAMA_33_70B, 4, attention="memory_efficient")
    assert longer.fits and (longer.parallelism, longer.processes) == ("fsdp", 4) and longer.plan is not None
    assert longer.plan.summary["inputs_offloaded"] and longer.plan.layout.fullest.headroom >= 1 * GIB
    kept_on_gpu = launch(example_spec(activation_offload=False), LLAMA_33_70B, 4, attention="memory_efficient")
    matrix = launch(example_spec(), LLAMA_33_70B, 4, attention="materialised")
    assert not kept_on_gpu.fits and matrix.plan is not None
    assert matrix.plan.layout.fullest.headroom < longer.plan.layout.fullest.headroom
    asked = launch(example_spec(parallelism="deviceMap"), LLAMA_33_70B, 4)
    assert asked.fits and (asked.parallelism, asked.processes) == ("deviceMap", 1)


def test_a_plan_that_does_not_fit_is_returned_not_raised():
    result = launch(example_spec(), LLAMA_33_70B, 2)
    assert not result.fits
    assert result.plan is not None and "does not fit" in result.plan.message


# --- GPUs, forced modes --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parallelism", "gpus", "expected"),
    [
        ("dataParallel", 2, ("dataParallel", 2)),
        ("fsdp", 2, ("fsdp", 2)),
        ("fsdp", 4, ("fsdp", 4)),
        ("deviceMap", 4, ("deviceMap", 1)),
        ("deviceMap", 1, ("deviceMap", 1)),
        ("fsdp", 1, ("fsdp", 1)),
    ],
)
def test_a_forced_mode_is_kept(parallelism: str, gpus: int, expected: tuple[str, int]):
    result = launch(example_spec(parallelism=parallelism), LLAMA_3_8B, gpus)
    assert (result.parallelism, result.processes) == expected
    assert result.plan is not None and result.plan.parallelism == expected[0]


def test_forced_data_parallel_that_does_not_fit_says_so():
    result = launch(example_spec(parallelism="dataParallel"), SLICE_40, 2)
    assert result.parallelism == "dataParallel" and not result.fits


def test_device_map_forced_on_four_gpus_spreads_the_layers():
    result = launch(example_spec(parallelism="deviceMap"), LLAMA_33_70B, 4)
    assert result.processes == 1 and result.plan is not None
    assert result.plan.device_map is not None and result.plan.device_map["lm_head"] == 3


def test_the_gpu_name_picks_the_product_and_memory_defaults_to_it():
    result = choose(example_spec(), LLAMA_3_8B, 2, gpu_name="NVIDIA H200")
    assert result.plan is not None
    assert result.plan.hardware.product.name == "NVIDIA-H200"
    assert result.plan.hardware.memory_gib == pytest.approx(139.8)


# --- the loss chunks the trainer must implement ---------------------------------------------


def test_the_trainer_needs_chunked_loss_for_the_issue_cases():
    """Whole-sequence FP32 logits do not fit next to the gathered head: the 40-layer slice on
    2 x 22.4 GiB and 70B on 4 x P40, both at the example's 1664 tokens, fit in fsdp only in chunks."""
    assert TRAINER_LOSS_CHUNKS[0] == 0 and len(TRAINER_LOSS_CHUNKS) > 1
    for config, gpus, length in ((SLICE_40, 2, 1664), (LLAMA_33_70B, 4, 1664)):
        spec = example_spec(parallelism="fsdp", max_length=length)
        chunked = launch(spec, config, gpus, attention="memory_efficient")
        assert chunked.plan is not None and chunked.plan.fits
        assert chunked.plan.recipe.loss_chunk_tokens > 0


# --- the FSDP memory model -----------------------------------------------------------------


def test_fsdp_embeddings_left_in_the_root_unit_stay_whole_for_the_step():
    """FSDP1 does not reshard the root after its forward: embeddings and head left there are
    held whole (plus their shard) from the forward to the end of the backward."""
    shape = shape_from_config(SLICE_40)
    p40 = lookup("Tesla-P40")
    assert p40 is not None
    recipe = replace(recipe_from_spec(example_spec(max_length=1664), p40), loss_chunk_tokens=512)
    hw = Hardware(2, p40, 22.4)
    own = fsdp_layout(shape, recipe, hw).per_gpu[0]
    root = fsdp_layout(shape, recipe, hw, embeddings_in_root=True).per_gpu[0]
    matrices = 2 * shape.vocab * shape.hidden * 4
    assert own.embeddings_head == pytest.approx(matrices / 2)
    assert root.embeddings_head == pytest.approx(matrices * 1.5)
    assert root.logits < own.logits  # the root's head needs no second gather for the loss
    assert own.total <= 22.4 * GIB < root.total


def test_a_tied_head_is_planned_whole_in_the_root():
    tied = shape_from_config({**LLAMA_3_8B, "tie_word_embeddings": True})
    p40 = lookup("Tesla-P40")
    assert p40 is not None
    gpu = fsdp_layout(tied, recipe_from_spec(example_spec(), p40), Hardware(4, p40, 22.4)).per_gpu[0]
    assert gpu.embeddings_head == pytest.approx(tied.vocab * tied.hidden * 4 * 1.25)


def test_known_model_table_plans_the_example_like_its_config():
    table = known_model("meta-llama/Llama-3.3-70B-Instruct")
    assert table is not None
    a, b = launch(example_spec(), table, 4), launch(example_spec(), LLAMA_33_70B, 4)
    assert a.plan is not None and b.plan is not None
    assert (a.parallelism, a.plan.per_gpu) == (b.parallelism, b.plan.per_gpu)

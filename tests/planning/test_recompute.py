"""`gradientCheckpointing: auto` spends spare memory on speed: more memory, fewer layers recomputed,
never past the cap less the margin, in every mode; `true`/`false` keep their meaning; offload is
counted on the host and said in words."""

from dataclasses import replace
from typing import Any

import pytest

from finetune_api.spec import FineTuneJobSpec
from finetune_plan import GIB, Hardware, Plan, Recipe, calibration, lookup, make_plan, memory, shape_from_config
from finetune_plan.host import need, pinned
from finetune_plan.messages.host import need_line
from finetune_plan.messages.report import render
from finetune_plan.parallelism import choose
from finetune_plan.tighter import savers_of, tighter

from .models import LLAMA_3_8B, LLAMA_33_70B

P40 = lookup("Tesla-P40")
assert P40 is not None
SHAPE_8B = shape_from_config(LLAMA_3_8B)
RECIPE = Recipe(max_length=2048, attention="memory_efficient", lora_dropout=False)
MARGIN = calibration.SHORT_HEADROOM_GIB * GIB


def _auto(memory_gib: float, gpus: int = 1, mode: str = "auto", shape=SHAPE_8B, offload=False):  # type: ignore[no-untyped-def]
    """`gradientCheckpointing: auto`; offload off unless asked, so the kept layers are what is sized."""
    assert P40 is not None
    hw = Hardware(gpus, P40, memory_gib)
    return make_plan(shape, RECIPE, hw, mode=mode, checkpointing="auto", offload=offload)  # type: ignore[arg-type]


@pytest.mark.parametrize(("gpus", "mode"), [(1, "auto"), (2, "data_parallel"), (2, "fsdp"), (2, "device_map")])
def test_more_memory_means_fewer_recomputed_layers_and_the_plan_stays_under_the_cap(gpus: int, mode: str) -> None:
    recomputed = []
    for memory_gib in (14.0, 18.0, 22.4, 32.0, 48.0, 80.0):
        plan = _auto(memory_gib, gpus, mode)
        assert plan.fits, (memory_gib, plan.message)
        for gpu in plan.per_gpu:
            # The margin holds: what a loss in chunks needs, plus a logits block for a whole one.
            block = 0 if plan.recipe.loss_chunk_tokens else RECIPE.max_length * SHAPE_8B.vocab * memory.FP32
            assert gpu.total <= memory_gib * GIB - MARGIN - block, (memory_gib, gpu)
        recomputed.append(memory.recomputed_layers(SHAPE_8B, plan.recipe))
    assert recomputed == sorted(recomputed, reverse=True), recomputed
    assert recomputed[0] > recomputed[-1], recomputed
    assert recomputed[-1] == 0  # 80 GiB holds every layer's activations


def test_one_more_kept_layer_would_break_the_margin() -> None:
    """auto fills the memory: the next layer kept leaves less than the margin."""
    plan = _auto(22.4)
    kept = plan.recipe.kept_layers
    assert 0 < kept < SHAPE_8B.layers
    more = make_plan(SHAPE_8B, replace(plan.recipe, kept_layers=kept + 1), plan.hardware, loss_chunks=[512])
    assert more.layout.fullest.headroom < MARGIN


def test_auto_is_faster_than_all_recompute_and_says_so() -> None:
    plan = _auto(22.4)
    assert plan.activations is not None and plan.speed is not None
    against = plan.activations.all_recompute_tokens_per_second
    assert against is not None and plan.speed.tokens_per_second > against
    kept = plan.recipe.kept_layers
    text = render(plan)
    assert f"recompute {32 - kept} of 32 layers, {kept} keep their activations" in text
    assert "all-recompute" in text and "offload   off (activationOffload: false)" in text


def test_true_and_false_keep_their_meaning() -> None:
    assert P40 is not None
    hw = Hardware(1, P40, 80.0)
    every = make_plan(SHAPE_8B, RECIPE, hw, checkpointing=True)
    assert memory.recomputed_layers(SHAPE_8B, every.recipe) == 32
    none = make_plan(SHAPE_8B, RECIPE, hw, checkpointing=False)
    assert memory.recomputed_layers(SHAPE_8B, none.recipe) == 0 and not none.recipe.gradient_checkpointing


def test_no_room_beyond_the_margin_recomputes_every_layer() -> None:
    tight = _auto(11.0)
    assert tight.fits and tight.recipe.kept_layers == 0
    assert tight.activations is not None and "recompute all 32 layers" in tight.activations.checkpointing


def test_offload_true_is_counted_in_the_pods_host_memory() -> None:
    plain = _auto(22.4)
    offloaded = _auto(22.4, offload=True)
    moved = memory.offloaded_layers(SHAPE_8B, offloaded.recipe)
    assert moved > 0 and memory.recomputed_layers(SHAPE_8B, offloaded.recipe) == 0
    held = moved * pinned.pinned_layer_bytes(SHAPE_8B, offloaded.recipe)
    assert offloaded.pinned_host_gib_per_process == pytest.approx(held / GIB)
    assert offloaded.host_gib_per_process == pytest.approx(plain.host_gib_per_process + held / GIB)
    assert offloaded.host.pod_bytes > plain.host.pod_bytes + held
    assert "of offloaded activations, pinned" in need_line(offloaded.host)
    assert offloaded.activations is not None and f"offload {moved} (" in offloaded.activations.checkpointing


def test_the_spec_reaches_the_plan_and_auto_is_the_default() -> None:
    spec = FineTuneJobSpec.model_validate(
        {
            "model": {"source": {"pvc": {"claimName": "m"}}},
            "dataset": {"source": {"pvc": {"claimName": "d", "path": "x.jsonl"}}, "format": "text"},
            "output": {"pvc": {"claimName": "o"}},
            "training": {"maxLength": 2048},
        }
    )
    assert spec.training.gradient_checkpointing == "auto" and spec.training.activation_offload == "auto"
    launch = choose(spec, LLAMA_3_8B, 1, gpu_name="Tesla P40", attention="memory_efficient")
    assert launch.plan is not None and launch.plan.summary["kept_layers"] > 0
    summary = launch.plan.summary
    assert summary["recomputed_layers"] + summary["offloaded_layers"] + summary["kept_layers"] == 32


def _spec(memory: str | None = None) -> FineTuneJobSpec:
    return FineTuneJobSpec.model_validate(
        {
            "model": {"source": {"pvc": {"claimName": "m"}}},
            "dataset": {"source": {"pvc": {"claimName": "d", "path": "x.jsonl"}}, "format": "text"},
            "output": {"pvc": {"claimName": "o"}},
            "training": {"maxLength": 2048},
            "resources": {"gpus": 1, **({"memory": memory} if memory else {})},
        }
    )


def test_auto_offloads_the_layers_left_to_recompute_when_the_copies_cost_less() -> None:
    """8B on one P40 at 2048 tokens, by hand: a layer's saved activations are about 0.7 GiB with
    the fused attention (no probabilities), so about 0.06 s each way over PCIe 3.0 (12 GB/s); a
    layer's forward is 2 x 218 M linear weights x 2048 tokens = 0.89 TFLOP, about 0.1 s at 80 %
    of the P40's 11.8 TFLOPS, its backward twice that. The copies hide under the compute, a
    recompute would cost the forward again: so every layer `auto` cannot keep is offloaded
    instead, the plan faster than keeping alone."""
    launch = choose(_spec(), LLAMA_3_8B, 1, gpu_name="Tesla P40", attention="memory_efficient")
    plan = launch.plan
    assert plan is not None and plan.activations is not None and plan.speed is not None
    summary = plan.summary
    assert summary["recomputed_layers"] == 0 and summary["offloaded_layers"] > 0
    assert summary["offloaded_layers"] + summary["kept_layers"] == 32
    moved = pinned.pinned_layer_bytes(SHAPE_8B, plan.recipe)
    assert 0.6 * GIB < memory.full_layer_activation_bytes(SHAPE_8B, plan.recipe) < moved < 0.9 * GIB
    kept_only = _auto(plan.hardware.memory_gib)
    assert kept_only.speed is not None and plan.speed.tokens_per_second > kept_only.speed.tokens_per_second
    assert plan.activations.offload.startswith("on (auto): ") and "recomputing" in plan.activations.offload
    assert plan.pinned_host_gib_per_process == pytest.approx(summary["offloaded_layers"] * moved / GIB)


def _offloaded(memory: str | None) -> tuple[Plan, dict[str, Any]]:
    plan = choose(_spec(memory), LLAMA_3_8B, 1, gpu_name="Tesla P40", attention="memory_efficient").plan
    assert plan is not None and plan.activations is not None
    return plan, plan.summary


def test_auto_offloads_only_the_layers_the_pods_memory_holds() -> None:
    """A pod whose resources.memory holds the trainer and some of its 13-odd GiB of activations:
    offload pins only the layers that fit (those just before the kept ones), the first ones
    recompute, and it says why; a pod that holds not one layer's offloads none, and recomputes."""
    _, every = _offloaded("64Gi")
    assert every["offloaded_layers"] > 0 and every["recomputed_layers"] == 0
    some, summary = _offloaded("16Gi")
    assert 0 < summary["offloaded_layers"] < every["offloaded_layers"] and summary["recomputed_layers"] > 0
    assert summary["kept_layers"] + summary["offloaded_layers"] + summary["recomputed_layers"] == 32
    assert some.activations is not None
    assert f"{summary['offloaded_layers']} layers: what fits the 16 GiB of spec.resources.memory" in (
        some.activations.offload
    )
    assert some.host.pod_bytes <= 16 * GIB
    # One layer more would not fit: the pinned memory is all the pod has left.
    moved = pinned.pinned_layer_bytes(SHAPE_8B, some.recipe)
    assert some.host.pod_bytes + moved * (1 + need.MARGIN_FRACTION) > 16 * GIB
    none, summary = _offloaded("6Gi")
    assert summary["offloaded_layers"] == 0 and summary["recomputed_layers"] > 0
    assert none.activations is not None and "off (auto): not one layer's" in none.activations.offload
    assert "of spec.resources.memory" in none.activations.offload
    assert none.host.pod_bytes <= 6 * GIB


def test_the_70b_slice_uncapped_keeps_every_layer() -> None:
    shape = shape_from_config({**LLAMA_33_70B, "num_hidden_layers": 4})
    h200 = lookup("NVIDIA H200")
    assert h200 is not None
    plan = make_plan(shape, RECIPE, Hardware(1, h200, h200.memory_gib), checkpointing="auto")
    assert memory.recomputed_layers(shape, plan.recipe) == 0


def test_an_oom_retry_of_auto_checkpoints_every_layer() -> None:
    spec = FineTuneJobSpec.model_validate(
        {
            "model": {"source": {"pvc": {"claimName": "m"}}},
            "dataset": {"source": {"pvc": {"claimName": "d", "path": "x.jsonl"}}, "format": "text"},
            "output": {"pvc": {"claimName": "o"}},
        }
    )
    notch = tighter(savers_of(spec, 0), dropout=True)
    assert notch is not None and notch.gradient_checkpointing is True

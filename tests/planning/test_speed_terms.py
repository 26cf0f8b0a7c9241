"""The speed model's adapter and offload terms and the planned cuBLAS workspaces, each against what
set it: the adapters' multipliers against the committed measurement of the trainer's own LoRA
modules (bench.calibration.lora_cost), the offload wait against the trainer's fetch order, the
workspaces against the product's cuBLAS default."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bench.calibration import lora_cost
from finetune_plan import GIB, Hardware, Recipe, lookup, shape_from_config, speed
from finetune_plan import calibration as cal
from finetune_plan import memory as mem
from finetune_plan.layouts.device_map import device_map_layout

RECORD = Path(__file__).resolve().parents[2] / "bench" / "results" / "2026-12-05-h100-lora-cost.json"
LLAMA3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 8,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
}
H200 = lookup("NVIDIA H200")
P40 = lookup("Tesla-P40")
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_the_adapter_multipliers_are_the_committed_measurements_fit():
    fitted = lora_cost.fit(json.loads(RECORD.read_text()))
    assert {name: fitted[name] for name in lora_cost.NAMES} == {name: getattr(cal, name) for name in lora_cost.NAMES}
    assert fitted["medianError"] <= 0.15, "the model of the adapter's traffic fits its own measurement"


def test_the_adapters_cost_grows_with_their_linears_tokens_and_dropout():
    assert H200 is not None
    shape = shape_from_config(LLAMA3_8B)
    qv = Recipe(max_length=2048, lora_targets=("q_proj", "v_proj"), lora_dropout=False)
    every = replace(qv, lora_targets=ALL_LINEAR)
    assert speed.adapter_seconds(shape, replace(qv, lora_targets=()), H200) == 0.0
    assert 0 < speed.adapter_seconds(shape, qv, H200) < speed.adapter_seconds(shape, every, H200)
    assert speed.adapter_seconds(shape, replace(every, lora_dropout=True), H200) > speed.adapter_seconds(
        shape, every, H200
    )
    doubled = replace(every, max_length=4096)
    assert speed.adapter_seconds(shape, doubled, H200) == pytest.approx(2 * speed.adapter_seconds(shape, every, H200))
    # A recomputed layer runs its adapters' forward again.
    recomputing = replace(every, gradient_checkpointing=True, kept_layers=0)
    kept = replace(every, gradient_checkpointing=False)
    assert speed.adapter_seconds(shape, recomputing, H200) > speed.adapter_seconds(shape, kept, H200)


def test_offload_waits_for_the_first_layer_the_backward_fetches():
    """However long the layers' compute, the backward waits for one layer's activations whole."""
    assert H200 is not None
    shape = shape_from_config(LLAMA3_8B)
    recipe = Recipe(max_length=2048, gradient_checkpointing=True, kept_layers=2, offload=True, lora_dropout=False)
    one_layer = mem.full_layer_activation_bytes(shape, recipe) / (H200.host_link_gbps * 1e9)
    assert mem.offloaded_layers(shape, recipe) == 6
    assert speed.offload_stall_seconds(shape, recipe, H200) >= one_layer
    slow_copies = replace(H200, host_link_gbps=H200.host_link_gbps / 4)
    assert speed.offload_stall_seconds(shape, recipe, slow_copies) > 4 * one_layer
    assert speed.offload_stall_seconds(shape, replace(recipe, offload=False), H200) == 0.0


@pytest.mark.parametrize(("product", "mib"), [(H200, 32.0), (P40, 8.125)], ids=["h200", "p40"])
def test_each_gpu_plans_two_cublas_workspaces_in_what_stays(product, mib):
    assert product is not None
    shape = shape_from_config(LLAMA3_8B)
    recipe = Recipe(max_length=1024)
    gpu = device_map_layout(shape, recipe, Hardware(1, product, product.memory_gib)).fullest
    assert gpu.workspaces == 2 * mib * 2**20
    without = replace(gpu, workspaces=0.0)
    assert gpu.resident - without.resident == pytest.approx(2 * mib * 2**20)
    assert gpu.parts_gib()["resident"] == pytest.approx(
        (without.resident - gpu.activations + gpu.workspaces) / GIB, abs=1e-3
    )

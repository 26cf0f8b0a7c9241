"""What the planner predicts for one recorded calibration run; shared by the test and the fit."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_plan import GIB, Hardware, Recipe, lookup, shape_from_config
from finetune_plan import calibration as cal
from finetune_plan.gpu_products import GpuProduct
from finetune_plan.layouts.device_map import device_map_layout
from finetune_plan.placement import Placement
from finetune_plan.speed import adapter_seconds, estimate, flops_per_token, memory_traffic_bytes

MEASUREMENTS = Path(__file__).with_name("measurements.json")
# The plan may sit above a measured peak more than below it: a planner that never admits an OOM
# errs high (the boundary phase records by how much); below, 10 % at most.
MEMORY_TOLERANCE = 0.20
SPEED_TOLERANCE = 0.25


@dataclass(frozen=True)
class Comparison:
    label: str
    measured_gib: list[float]
    predicted_gib: list[float]
    measured_tokens_per_second: float
    predicted_tokens_per_second: float
    # The parts of the predicted step time, for the fit: FLOPs at 100% of the FP32 peak,
    # memory-bound seconds, and layer passes (each costing LAYER_PASS_SECONDS).
    peak_seconds: float
    memory_seconds: float
    layer_passes: int
    hops: int  # GPU boundaries crossed per micro-batch in device_map mode
    tokens: int

    def memory_errors(self) -> list[float]:
        return [p / m - 1 for p, m in zip(self.predicted_gib, self.measured_gib, strict=True)]

    @property
    def speed_error(self) -> float:
        return self.predicted_tokens_per_second / self.measured_tokens_per_second - 1


def load() -> dict[str, Any] | None:
    if not MEASUREMENTS.exists():
        return None
    data: dict[str, Any] = json.loads(MEASUREMENTS.read_text())
    return data


def product_of(record: dict[str, Any]) -> GpuProduct:
    product = lookup(str(record["gpu"]))
    if product is None:
        raise ValueError(f"measurements.json: GPU {record['gpu']!r} is not in the planner's product table")
    return product


def label(run: dict[str, Any]) -> str:
    ckpt = "ckpt" if run["gradient_checkpointing"] else "full"
    return f"{run['arch']}-seq{run['max_length']}-{ckpt}-{run['gpus']}gpu"


def compare(run: dict[str, Any], record: dict[str, Any]) -> Comparison:
    shape = shape_from_config(
        {
            "hidden_size": run["hidden"],
            "intermediate_size": run["intermediate"],
            "num_hidden_layers": run["layers"],
            "num_attention_heads": run["heads"],
            "num_key_value_heads": run["kv_heads"],
            "vocab_size": run["vocab"],
        }
    )
    recipe = Recipe(
        max_length=run["max_length"], gradient_checkpointing=run["gradient_checkpointing"], loss_chunk_tokens=0
    )
    product = product_of(record)
    hw = Hardware(run["gpus"], product, product.memory_gib)
    layout = device_map_layout(shape, recipe, hw, Placement(tuple(run["layers_per_gpu"])))
    speed = estimate(shape, recipe, product, gpus=run["gpus"], mode="device_map")
    passes = 3 if recipe.gradient_checkpointing else 2
    return Comparison(
        label=label(run),
        measured_gib=[float(x) for x in run["peak_allocated_gib"]],
        predicted_gib=[g.allocated / GIB for g in layout.per_gpu],
        measured_tokens_per_second=float(run["tokens_per_second"]),
        # The grid's harness times the forward, backward and optimizer step alone: not the
        # trainer's own work per step, which the plan counts for the pod (STEP_SECONDS).
        predicted_tokens_per_second=recipe.tokens / (speed.step_seconds - cal.STEP_SECONDS),
        peak_seconds=flops_per_token(shape, recipe) * recipe.tokens / (product.fp32_tflops * 1e12),
        memory_seconds=memory_traffic_bytes(shape, recipe) / (product.memory_gbps * 1e9 * cal.BANDWIDTH_UTILISATION)
        + adapter_seconds(shape, recipe, product),
        layer_passes=shape.layers * passes,
        hops=run["gpus"] - 1,
        tokens=recipe.tokens,
    )

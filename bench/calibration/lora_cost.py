"""What one LoRA adapter adds to its linear, measured apart on the GPU, for the speed model's
adapter term (`finetune_plan.speed.adapter_seconds`).

The modules are the trainer's own: bitsandbytes' NF4 `Linear4bit` (double quantisation, FP32
compute) wrapped by PEFT's LoRA layer (`inject_adapter_in_model`, as `get_peft_model` wraps every
target), TF32 off. For each linear shape, rank, dropout and token count it times, with CUDA
events, the forward and the forward plus backward of the bare NF4 linear and of the adapted one
(the input requires its gradient, as a decoder layer's does); the adapter's cost is the
difference. The planner counts the adapter's matmuls as FLOPs (`speed.flops_per_token`) and the
rest as memory traffic, since those matmuls are skinny (r columns against thousands) and what they
and the sums around them move is what costs:

    forward  = (FORWARD_IN x in + FORWARD_OUT x out + FORWARD_DROPOUT x in x dropout) x tokens x 4 B
    backward = (BACKWARD_IN x in + BACKWARD_OUT x out + BACKWARD_DROPOUT x in x dropout) x tokens x 4 B

at the GPU's memory bandwidth times `BANDWIDTH_UTILISATION` (`speed.adapter_seconds`); `fit` solves
the six multipliers (`calibration.ADAPTER_*_FLOATS`) by least squares on the relative error.

    python -m bench.calibration.lora_cost --out lora-cost.json     # on the GPU
    python -m bench.calibration.lora_cost --fit bench/results/<date>-<gpu>-lora-cost.json
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import product
from pathlib import Path
from typing import Any

from bench.source_roots import on_path

# (in_features, out_features): Llama-3-8B's q/o and k/v, its MLP in and out; 13B's MLP.
SHAPES = ((4096, 4096), (4096, 1024), (4096, 14336), (14336, 4096), (5120, 13824), (13824, 5120))
RANKS = (8, 64)
DROPOUTS = (0.0, 0.1)
TOKENS = (2048, 4096)
REPEATS = 8


def _time(fn: Any, repeats: int) -> float:
    import torch

    for _ in range(2):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / repeats


def measure_one(fan_in: int, fan_out: int, rank: int, dropout: float, tokens: int) -> dict[str, Any]:
    import bitsandbytes as bnb
    import torch
    from peft import LoraConfig, inject_adapter_in_model
    from torch import nn

    class One(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = bnb.nn.Linear4bit(
                fan_in, fan_out, bias=False, compute_dtype=torch.float32, quant_type="nf4", compress_statistics=True
            )

    bare = One()
    bare.proj.weight = bnb.nn.Params4bit(
        (torch.randn(fan_out, fan_in) * 0.02).to(torch.bfloat16), requires_grad=False, quant_type="nf4"
    )
    bare = bare.cuda()
    x = torch.randn(tokens, fan_in, device="cuda", requires_grad=True)
    grad = torch.randn(tokens, fan_out, device="cuda")

    def forward() -> None:
        bare.proj(x)

    def both() -> None:
        bare.proj(x).backward(grad)
        x.grad = None

    base = (_time(forward, REPEATS), _time(both, REPEATS))
    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=dropout, target_modules=["proj"], bias="none")
    adapted = inject_adapter_in_model(config, bare).cuda()
    for p in adapted.parameters():
        if p.dtype == torch.float32 and p.requires_grad:
            p.data.normal_(0, 0.02)  # B starts at zero; any values time alike, but not all-zero ones

    def forward_lora() -> None:
        adapted.proj(x)

    def both_lora() -> None:
        adapted.proj(x).backward(grad)
        x.grad = None
        adapted.zero_grad(set_to_none=True)

    with_adapter = (_time(forward_lora, REPEATS), _time(both_lora, REPEATS))
    forward_s = with_adapter[0] - base[0]
    return {
        "in": fan_in,
        "out": fan_out,
        "r": rank,
        "dropout": dropout,
        "tokens": tokens,
        "baseForwardS": round(base[0], 6),
        "baseBothS": round(base[1], 6),
        "loraForwardS": round(with_adapter[0], 6),
        "loraBothS": round(with_adapter[1], 6),
        "adapterForwardS": round(forward_s, 6),
        "adapterBackwardS": round(with_adapter[1] - base[1] - forward_s, 6),
    }


def measure(out: Path) -> dict[str, Any]:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    record: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "repeats": REPEATS, "points": []}
    for (fan_in, fan_out), rank, dropout, tokens in product(SHAPES, RANKS, DROPOUTS, TOKENS):
        record["points"].append(measure_one(fan_in, fan_out, rank, dropout, tokens))
        out.write_text(json.dumps(record, indent=1) + "\n")
        torch.cuda.empty_cache()
    return record


def columns(point: dict[str, Any], memory_gbps: float, bandwidth_utilisation: float) -> tuple[list[float], list[float]]:
    """The multipliers' columns for the forward and the backward: seconds per float per token of
    the adapter's input width, of its output width, and of the input again under dropout."""
    per_float = point["tokens"] * 4 / (memory_gbps * 1e9 * bandwidth_utilisation)
    fan_in, fan_out = point["in"] * per_float, point["out"] * per_float
    drop = fan_in if point["dropout"] else 0.0
    return [fan_in, fan_out, drop, 0, 0, 0], [0, 0, 0, fan_in, fan_out, drop]


def matmul_seconds(point: dict[str, Any], fp32_tflops: float, compute_utilisation: float) -> tuple[float, float]:
    """The adapter's matmuls as the planner counts them already (`speed.flops_per_token`: 2 FLOPs
    per adapter weight per token forward, 4 backward), at the recipe's matmul share of the peak."""
    flops = point["tokens"] * point["r"] * (point["in"] + point["out"])
    rate = fp32_tflops * 1e12 * compute_utilisation
    return 2 * flops / rate, 4 * flops / rate


NAMES = (
    "ADAPTER_FORWARD_IN_FLOATS",
    "ADAPTER_FORWARD_OUT_FLOATS",
    "ADAPTER_FORWARD_DROPOUT_FLOATS",
    "ADAPTER_BACKWARD_IN_FLOATS",
    "ADAPTER_BACKWARD_OUT_FLOATS",
    "ADAPTER_BACKWARD_DROPOUT_FLOATS",
)


def fit(record: dict[str, Any]) -> dict[str, float]:
    """Least squares on the relative error, the adapter's matmuls (counted apart by the planner)
    taken off first; a timing more than 50 % off the first fit (a stray allocation or a clock
    change inside a sub-millisecond difference) is left out of the second."""
    import numpy as np

    sys.path[:0] = [p for p in on_path() if p not in sys.path]
    from finetune_plan import calibration as cal
    from finetune_plan.gpu_products import lookup

    product_ = lookup(record["gpu"])
    assert product_ is not None, record["gpu"]
    rows, measured = [], []
    for point in record["points"]:
        forward, backward = columns(point, product_.memory_gbps, cal.BANDWIDTH_UTILISATION)
        matmuls = matmul_seconds(point, product_.fp32_tflops, cal.COMPUTE_UTILISATION)
        rows += [forward, backward]
        measured += [point["adapterForwardS"] - matmuls[0], point["adapterBackwardS"] - matmuls[1]]
    a, m = np.array(rows, dtype=float), np.array(measured)
    keep = m > 0
    for _ in range(2):
        solution, *_ = np.linalg.lstsq(a[keep] / m[keep, None], np.ones(int(keep.sum())), rcond=None)
        keep &= np.abs(a @ solution / np.where(m > 0, m, np.inf) - 1) <= 0.5
    error = np.abs(a[keep] @ solution / m[keep] - 1)
    figures = {n: round(float(v), 2) for n, v in zip(NAMES, solution, strict=True)}
    return {**figures, "used": int(keep.sum()), "of": len(m), "medianError": round(float(np.median(error)), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="measure on the GPU and write the record here")
    parser.add_argument("--fit", type=Path, help="print the multipliers that fit a record")
    args = parser.parse_args()
    if args.out:
        record = measure(args.out)
        print(json.dumps(fit(record)))
    if args.fit:
        print(json.dumps(fit(json.loads(args.fit.read_text())), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

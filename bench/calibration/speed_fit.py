"""Fit the speed constants to runs of the pod's command, and print how every run compares.

The runs: the `fit` points of the held-out phase (bench/heldout.py: rank 64 on every linear, with
and without dropout, multi-head attention, a 32k vocabulary, batch 2, each laid out several ways),
the long-sequence points and the 6-layer 70B-shaped slice of 2026-12-04, all through the pod's
command; and the grid of bench/calibration/measurements.json (2026-11-30: two widths, 512 and 2048
tokens, one and two GPUs in deviceMap), timed by a harness of its own around forward, backward and
optimizer, so without the trainer's cost per step. The `heldout` points are never read here: they
judge the fit (`python -m bench.heldout`).

The model (`finetune_plan.speed.compute_seconds`): matmul FLOPs at a share of the FP32 peak, the
fused attention at its own measured share, NF4 dequantisation at a share of the memory bandwidth,
a fixed cost per decoder-layer pass and one per optimizer step, and what offload's copies do not
hide. Least squares on the relative error fits the matmuls' share, the cost per layer pass, the
cost per step and deviceMap's hand-over between GPUs; the rest stays as measured apart.

    PYTHONPATH=api:planner:trainer_image:. python -m bench.calibration.speed_fit
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"
FIT_RECORDS = ("2026-12-05-h200-heldout-fit.json",)
BOUNDARY_RECORDS = ("2026-12-04-h200-boundary-long.json",)
COMPARE_RECORDS = ("2026-12-04-h200-1gpu.json",)


@dataclass(frozen=True)
class Run:
    label: str
    plan: Any  # finetune_plan.Plan
    measured_tokens_per_second: float


def runs() -> Iterator[Run]:
    from bench import boundary, heldout

    points = {p.name: p for p in heldout.POINTS}
    settings = {label: (ckpt, offload) for label, ckpt, offload in heldout.RUNS}
    for name in FIT_RECORDS:
        record = json.loads((RESULTS / name).read_text())
        for point in record["points"]:
            if points[point["point"]].kind != "fit":
                continue
            for row in point["runs"]:
                if row.get("tokPerS") and not row.get("sameAs"):
                    ckpt, offload = settings[row["run"]]
                    launch = heldout.planned(points[point["point"]], ckpt, offload, record["steps"], record["gpu"])
                    # A run laid out otherwise than today's plan lays it out (the plan changed since)
                    # measured another layout: it cannot judge this one.
                    if heldout.laid_out_as_ran(launch.plan, row):
                        yield Run(f"{point['point']}/{row['run']}", launch.plan, row["tokPerS"])
    for name in BOUNDARY_RECORDS:
        record = json.loads((RESULTS / name).read_text())
        for row in record["points"]:
            if row.get("tokPerS"):
                at = boundary.Point(row["width"], row["seq"], row["gradientCheckpointing"], row["batch"], row["layers"])
                kernel = boundary.planned_attention(row["attention"])
                plan = boundary.planned(at, row["layers"], record["steps"], kernel)
                yield Run(f"{row['point']}-{row['layers']}l", plan, row["tokPerS"])
    for name in COMPARE_RECORDS:
        record = json.loads((RESULTS / name).read_text())
        layers = record["shape"]["layers"]
        at = boundary.Point("70b", record["seq"], record["gradient_checkpointing"], layers=layers)
        plan = boundary.planned(at, layers, record["steps"] + record["warm_steps"])
        yield Run(f"70b-{layers}l-compare", plan, record["ours"]["tok_s"])


def grid() -> Iterator[tuple[str, list[float], float, float]]:
    """The 2026-11-30 grid: label, the fitted terms' multipliers, fixed seconds, measured seconds."""
    from .compare import compare, label, load

    record = load()
    for run in (record or {}).get("runs", []):
        if "error" not in run:
            c = compare(run, record or {})
            measured = c.tokens / c.measured_tokens_per_second
            yield label(run), [c.peak_seconds, float(c.layer_passes), 0.0, float(c.hops)], c.memory_seconds, measured


def columns(plan: Any) -> tuple[list[float], float]:
    """The fitted terms' multipliers (matmul seconds at the full peak, layer passes, steps per
    micro-batch, deviceMap hand-overs) and the fixed seconds (attention at its share,
    dequantisation, offload stall, the adapters' traffic measured apart)."""
    from finetune_plan import calibration as cal
    from finetune_plan import speed

    shape, recipe, product = plan.shape, plan.recipe, plan.hardware.product
    peak = product.fp32_tflops * 1e12
    attention = speed.attention_flops_per_token(shape, recipe) * recipe.tokens
    fused = 0.0 if speed.keeps_attention_matrix(recipe) else attention
    matmuls = speed.flops_per_token(shape, recipe) * recipe.tokens - fused
    fixed = (
        fused / (peak * cal.FUSED_ATTENTION_UTILISATION)
        + speed.memory_traffic_bytes(shape, recipe) / (product.memory_gbps * 1e9 * cal.BANDWIDTH_UTILISATION)
        + speed.offload_stall_seconds(shape, recipe, product)
        + speed.adapter_seconds(shape, recipe, product)
    )
    return [matmuls / peak, float(speed.layer_passes(shape, recipe)), 1.0 / recipe.gradient_accumulation, 0.0], fixed


def main() -> int:
    import numpy as np

    found = list(runs())
    older = list(grid())
    rows = [columns(r.plan) for r in found] + [(cols, fixed) for _, cols, fixed, _ in older]
    labels = [r.label for r in found] + [name for name, _, _, _ in older]
    measured = np.array(
        [r.plan.recipe.tokens / r.measured_tokens_per_second for r in found] + [m for _, _, _, m in older]
    )
    a = np.array([c for c, _ in rows])
    fixed = np.array([f for _, f in rows])
    solution, *_ = np.linalg.lstsq(a / measured[:, None], (measured - fixed) / measured, rcond=None)
    inverse, per_pass, per_step, hop = (float(x) for x in solution)
    print(f"COMPUTE_UTILISATION: Final = {1 / inverse:.3f}")
    print(f"LAYER_PASS_SECONDS: Final = {per_pass:.5f}")
    print(f"DEVICE_HOP_SECONDS: Final = {hop:.5f}")
    print(f"STEP_SECONDS: Final = {per_step:.4f}\n")
    print(f"{'run':48} {'measured s':>10} {'refit s':>8} {'measured / refit speed':>23}")
    worst = 0.0
    for name, seconds, (cols, fix) in zip(labels, measured, rows, strict=True):
        refit = float(np.dot(cols, solution)) + fix
        worst = max(worst, abs(refit / seconds - 1))
        print(f"{name:48} {seconds:10.4f} {refit:8.4f} {refit / seconds:23.3f}")
    print(f"\nworst: {worst:.1%} off the measured speed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

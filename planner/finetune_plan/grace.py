"""How long the pod needs between SIGTERM and a complete checkpoint: its grace period.

On SIGTERM the trainer finishes the micro-batch under way, sums the adapter's gradients over the
ranks, and rank 0 writes the adapter, those gradients and the optimizer state (the frozen NF4
weights are never written). So the time is one micro-batch plus that write at the checkpoint
volume's speed. The pod's `terminationGracePeriodSeconds` is that estimate with a margin,
never below a floor; a model whose shape is not known before its pod starts (a PVC model not
named after a known Hub model) gets the default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .memory import FP32, optimizer_bytes
from .results.plan import Plan

# Stated write speed of the checkpoint volume: a network-attached PV's sustained write. A local
# NVMe disk is ten times faster; a slower volume needs a longer grace period than planned.
DISK_BYTES_PER_S = 100 * 10**6
MARGIN = 1.5  # on the estimate: a loaded node, a slow fsync
FIXED_S = 15.0  # process signalling, the collective, fsync and rename, the pod's own exit
FLOOR_S = 60
DEFAULT_S = 120  # when the shape is unknown before the pod starts


@dataclass(frozen=True)
class Grace:
    seconds: int
    micro_batch_s: float | None  # None: not planned (CPU, or an unknown shape)
    write_bytes: int | None
    write_s: float | None

    def describe(self) -> str:
        if self.micro_batch_s is None or self.write_bytes is None or self.write_s is None:
            return f"grace {self.seconds} s on SIGTERM (the default: no GPU plan for this job)"
        return (
            f"grace {self.seconds} s on SIGTERM: finish a micro-batch ({self.micro_batch_s:.1f} s), write "
            f"{self.write_bytes / 2**30:.2f} GiB of adapter, gradients and optimizer at "
            f"{DISK_BYTES_PER_S / 1e6:.0f} MB/s ({self.write_s:.1f} s), x{MARGIN:g} + {FIXED_S:g} s, "
            f"at least {FLOOR_S} s"
        )


def checkpoint_bytes(adapter_params: int, optimizer: str) -> int:
    """Adapter weights and summed gradients in FP32, plus the optimizer's state."""
    return int(adapter_params * (2 * FP32 + optimizer_bytes(optimizer)))


def grace_seconds(micro_batch_s: float, write_bytes: int) -> Grace:
    write_s = write_bytes / DISK_BYTES_PER_S
    seconds = max(FLOOR_S, math.ceil(MARGIN * (micro_batch_s + write_s) + FIXED_S))
    return Grace(seconds, micro_batch_s, write_bytes, write_s)


def grace_of(plan: Plan | None) -> Grace:
    if plan is None or plan.speed is None:
        return Grace(DEFAULT_S, None, None, None)
    shape, recipe = plan.shape, plan.recipe
    params = shape.layers * shape.lora_params_per_layer(recipe.lora_r, recipe.lora_targets)
    # GRPO's micro-batch may be under way with its rollouts whole (`Speed.longest_seconds`).
    return grace_seconds(plan.speed.longest_seconds, checkpoint_bytes(params, recipe.optimizer))


def clock_steps(plan: Plan, every_minutes: int, accumulation: int) -> int | None:
    """Optimizer steps in `every_minutes` at the planned speed (each rank runs `accumulation`
    micro-batches per step, alongside the others)."""
    if plan.speed is None or plan.speed.step_seconds <= 0:
        return None
    return max(1, int(every_minutes * 60 / (accumulation * plan.speed.step_seconds)))

"""What model loading needs from the plan: where the layers go and how much each GPU may hold.

The memory arithmetic lives in `finetune_plan` (the planner); `launch_plan.decide`
has already refused a job that cannot fit, before any weight is loaded.
"""

from dataclasses import dataclass
from typing import Any

from finetune_plan import LayerLayout
from finetune_plan.parallelism import LaunchPlan

from ..hardware.capabilities import Hardware


@dataclass(frozen=True)
class MemoryPlan:
    """The plan as model loading applies it, typed; `summary` is the plan's record for the log and
    the run's summary only (nothing reads a decision from it)."""

    max_memory: dict[int | str, int] | None  # bytes per GPU index for device_map="auto"; None on CPU
    source: str  # "planner" or "cpu"
    summary: dict[str, Any]
    device_map: dict[str, int] | None = None  # the planner's layer placement (deviceMap mode)
    layers: LayerLayout | None = None  # which layers keep, recompute or offload; None: no plan sized them
    # fsdp: one process's host memory were the checkpoint loaded whole (`Plan.whole_load_host_gib_per_process`).
    whole_load_host_gib_per_process: float | None = None
    # A pair's sequences one forward each (`finetune_plan.pairs`); None: no plan decided it.
    pair_split: bool | None = None

    def splits_pairs(self, asked: bool | str) -> bool:
        """The plan's pair split, or on the CPU, which no plan sizes, the spec's
        (`training.pairSplit`: true splits, false and auto do not, no GPU memory to fill)."""
        return asked is True if self.pair_split is None else self.pair_split


def memory_plan(launch: LaunchPlan, hardware: Hardware) -> MemoryPlan:
    plan = launch.plan
    if not hardware.on_gpu or plan is None:
        return MemoryPlan(None, "cpu", {})
    budget: dict[int | str, int] = {int(k): int(v) for k, v in (plan.max_memory or {}).items()}
    return MemoryPlan(
        budget or None,
        "planner",
        dict(plan.summary),
        plan.device_map,
        layers=plan.layers,
        whole_load_host_gib_per_process=plan.whole_load_host_gib_per_process,
        pair_split=plan.recipe.pair_split,
    )

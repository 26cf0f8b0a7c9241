"""deviceMap: one process, the layers spread over the pod's GPUs (one GPU busy at a time).

Naive model parallelism inside one process: the planner's layer placement when it made one,
else accelerate's within the per-GPU budget. Nothing to reduce (one process); every visible GPU
is capped and measured; the loop feeds batches from the host (accelerate's hooks move them).
"""

from __future__ import annotations

import torch

from finetune_api.reasons import ExitReason
from finetune_plan.parallelism import LaunchPlan

from ..distributed.topology import Topology
from ..failures import TrainerFailure
from ..hardware.capabilities import Hardware
from ..memory.budget import MemoryPlan
from ..memory.phases import PhaseProbe
from .base import Mode, Placement


class DeviceMap(Mode):
    def check_world(self, launch: LaunchPlan, world_size: int) -> None:
        super().check_world(launch, world_size)
        if world_size != 1:
            raise TrainerFailure(
                ExitReason.InvalidConfig, "spec.training.parallelism deviceMap runs one process; --nproc must be 1"
            )

    def device_map(self, hardware: Hardware, plan: MemoryPlan, device: torch.device) -> Placement:
        if not hardware.on_gpu or len(hardware.gpus) == 1:
            return super().device_map(hardware, plan, device)
        return plan.device_map or "auto"

    def memory_cap_device(self, device: torch.device) -> int | None:
        return None

    def loop_device(self, device: torch.device) -> torch.device:
        return torch.device("cpu")

    def peaks(self, hardware: Hardware, ranks: Topology, device: torch.device, probe: PhaseProbe) -> list[float]:
        # The loop runs on the CPU here, so the probe never cut the GPUs' peaks.
        if not hardware.on_gpu:
            return []
        return [round(torch.cuda.max_memory_allocated(g.index) / 2**30, 2) for g in hardware.gpus]

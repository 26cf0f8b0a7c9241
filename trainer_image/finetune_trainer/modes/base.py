"""What a training mode decides, in one place: the base every mode in this package fills in.

The defaults are those of a mode whose processes each hold the whole model on their own device
(dataParallel and the single process): a mode overrides what it does otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import torch
from torch import nn

from finetune_api.reasons import ExitReason
from finetune_plan.parallelism import LaunchPlan

from ..distributed.gradsync import sum_figures, sum_over_ranks
from ..distributed.topology import Topology
from ..failures import TrainerFailure
from ..hardware.capabilities import Hardware
from ..memory.budget import MemoryPlan
from ..memory.phases import PhaseProbe
from .streaming import Stream

# transformers' `device_map`: "auto", or module name -> GPU index or "cpu".
Placement = str | Mapping[str, int | str]


class Mode:
    """One training mode: its processes, how it loads, wraps, reduces, measures and feeds."""

    # Every rank must run every forward, past the data's end too (a collective inside forward).
    sharded: ClassVar[bool] = False
    # The 4-bit weights' storage dtype (bitsandbytes' `bnb_4bit_quant_storage`).
    quant_storage: ClassVar[torch.dtype] = torch.uint8
    # Layers may load off the GPUs (onto the host) without that meaning the model does not fit.
    loads_on_host: ClassVar[bool] = False
    # The model is built on the meta device and read from the checkpoint as the mode wraps it
    # (`streaming`), when the checkpoint allows; `stream` is then the reader.
    streams: ClassVar[bool] = False
    stream: Stream | None = None
    # The checkpoint's bytes this process read from the model volume (summed over the pod in
    # summary.json): the safetensors files' size when from_pretrained reads them all.
    bytes_read: int = 0

    # --- processes ---------------------------------------------------------------------------
    def check_world(self, launch: LaunchPlan, world_size: int) -> None:
        """The launcher started as many processes as the plan asks for (a local `--nproc` may
        differ on the CPU). `world_size` is the pod's (the local world): a job of several nodes
        runs the plan in each pod."""
        if launch.plan is not None and world_size != launch.processes:
            raise TrainerFailure(
                ExitReason.InvalidConfig,
                f"{launch.parallelism} on this pod needs {launch.processes} process(es), {world_size} were started",
            )

    # --- loading -----------------------------------------------------------------------------
    def device_map(self, hardware: Hardware, plan: MemoryPlan, device: torch.device) -> Placement:
        """transformers' `device_map`: the whole model on this rank's GPU (the host on the CPU)."""
        if not hardware.on_gpu:
            return {"": "cpu"}
        return {"": device.index if device.type == "cuda" else hardware.gpus[0].index}

    def quantise_on(self, hardware: Hardware, device: torch.device) -> torch.device:
        """Where the weights are quantised as they load (`gpu_quantise`): the CPU, unless moved."""
        return torch.device("cpu")

    def memory_cap_device(self, device: torch.device) -> int | None:
        """The GPU whose memory is capped for this process; None caps every visible GPU."""
        return device.index

    # --- training ----------------------------------------------------------------------------
    def wrap(self, model: nn.Module, trainable: Sequence[nn.Parameter], ranks: Topology, on_gpu: bool) -> nn.Module:
        """The module the loop trains: the loaded model as it is."""
        return model

    def reduce(self, params: Sequence[nn.Parameter], figures: Sequence[float], world_size: int) -> list[float]:
        """Sum the adapter's gradients and the step's figures over the ranks, in place."""
        return sum_over_ranks(params, figures, world_size)

    def loop_device(self, device: torch.device) -> torch.device:
        """The device the loop puts each batch on."""
        return device

    # --- measuring ---------------------------------------------------------------------------
    def peaks(self, hardware: Hardware, ranks: Topology, device: torch.device, probe: PhaseProbe) -> list[float]:
        """Peak GiB allocated on every GPU of the pod, gathered to every rank: each rank its own
        (from the probe, which resets the allocator's peak at each phase)."""
        if not hardware.on_gpu:
            return []
        mine = [0.0] * ranks.world_size
        mine[ranks.rank] = probe.peak_bytes() / 2**30
        return [round(v, 2) for v in sum_figures(mine, ranks.world_size, device)]

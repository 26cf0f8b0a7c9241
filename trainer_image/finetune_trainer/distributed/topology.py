"""Where this process sits in the job: rank, world size, its device; set up by the launcher."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Topology:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def spans_pods(self) -> bool:
        """Ranks in other pods (a multi-node job): they may not see this pod's volumes."""
        return self.world_size > self.local_world_size

    def device(self, on_gpu: bool) -> torch.device:
        return torch.device("cuda", self.local_rank) if on_gpu else torch.device("cpu")

    def backend(self, on_gpu: bool) -> str:
        # gloo lets the same code run (and be tested) on CPU-only machines.
        return "nccl" if on_gpu else "gloo"


SINGLE = Topology(rank=0, world_size=1, local_rank=0, local_world_size=1)


def from_env(env: dict[str, str] | None = None) -> Topology:
    """Read the launcher's variables; a plain `python` start is a world of one."""
    values = os.environ if env is None else env
    world = int(values.get("WORLD_SIZE", "1"))
    return Topology(
        rank=int(values.get("RANK", "0")),
        world_size=world,
        local_rank=int(values.get("LOCAL_RANK", "0")),
        local_world_size=int(values.get("LOCAL_WORLD_SIZE", str(world))),
    )


def start(topology: Topology, on_gpu: bool, timeout_s: float = 1800.0) -> None:
    """Join the process group (a no-op for a world of one)."""
    if topology.world_size == 1 or dist.is_initialized():
        return
    if on_gpu:
        torch.cuda.set_device(topology.local_rank)
    # A 70B load can keep one rank busy for many minutes before the first collective.
    dist.init_process_group(
        backend=topology.backend(on_gpu),
        rank=topology.rank,
        world_size=topology.world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def barrier(topology: Topology) -> None:
    if topology.world_size > 1 and dist.is_initialized():
        dist.barrier()

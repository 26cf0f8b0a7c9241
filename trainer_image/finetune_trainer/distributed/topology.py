"""Where this process sits in the job: rank, world size, its device; set up by torchrun."""

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

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    @property
    def backend(self) -> str:
        # gloo lets the same code run (and be tested) on CPU-only machines.
        return "nccl" if torch.cuda.is_available() else "gloo"


def from_env(env: dict[str, str] | None = None) -> Topology:
    """Read torchrun's variables; a plain `python` start is a world of one."""
    values = os.environ if env is None else env
    return Topology(
        rank=int(values.get("RANK", "0")),
        world_size=int(values.get("WORLD_SIZE", "1")),
        local_rank=int(values.get("LOCAL_RANK", "0")),
    )


def start(topology: Topology, timeout_s: float = 1800.0) -> None:
    """Join the process group (a no-op for a world of one)."""
    if topology.world_size == 1 or dist.is_initialized():
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(topology.local_rank)
    # A 70B load can keep one rank busy for many minutes before the first collective.
    dist.init_process_group(
        backend=topology.backend,
        rank=topology.rank,
        world_size=topology.world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def stop() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()

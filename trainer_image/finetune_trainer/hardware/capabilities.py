"""What the visible hardware can do: GPU capabilities, precision, compiler.

Pascal (compute capability 6.x) is the reason this module exists: no bf16, no tensor cores,
no Triton, and `torch.compile` needs 7.0+. Everything here is decided once at start-up and
logged, so a run on a mixed cluster says exactly which path it took.
"""

import logging
import os
from dataclasses import dataclass
from typing import Literal

import torch

from finetune_api import contract
from finetune_api.reasons import ExitReason
from finetune_api.spec import FineTuneJobSpec

from ..failures import TrainerFailure

log = logging.getLogger(__name__)

ResolvedPrecision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[ResolvedPrecision, ...] = ("fp32", "bf16", "fp16")

# Triton and torch.compile generate code for compute capability 7.0 and newer only.
MIN_COMPILER_CAPABILITY = (7, 0)
MIN_BF16_CAPABILITY = (8, 0)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    capability: tuple[int, int]
    total_bytes: int  # what this process may use: the card's memory, or the cap when set
    physical_bytes: int = 0


@dataclass(frozen=True)
class Hardware:
    gpus: tuple[Gpu, ...]

    @property
    def on_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def min_capability(self) -> tuple[int, int] | None:
        return min((g.capability for g in self.gpus), default=None)

    def describe(self) -> str:
        if not self.gpus:
            return "CPU"
        return ", ".join(f"cuda:{g.index} {g.name} (sm_{g.capability[0]}{g.capability[1]})" for g in self.gpus)


# Cap each process's GPU memory (GiB), e.g. 22.4 to behave like a P40 on a larger card.
MEMORY_CAP_ENV = "FINETUNE_GPU_MEMORY_GIB"


def memory_cap_bytes() -> int | None:
    value = os.environ.get(MEMORY_CAP_ENV, "").strip()
    try:
        return int(float(value) * 2**30) if value else None
    except ValueError:
        raise TrainerFailure(
            ExitReason.InvalidConfig, f"{MEMORY_CAP_ENV}: expected GiB as a number, got {value!r}"
        ) from None


def apply_memory_cap(hardware: "Hardware", device_index: int | None) -> None:
    """Hold this process to the cap on its GPU(s): the allocator refuses beyond it, as a P40 would."""
    cap = memory_cap_bytes()
    if cap is None:
        return
    for gpu in hardware.gpus:
        if device_index is None or gpu.index == device_index:
            torch.cuda.set_per_process_memory_fraction(
                min(1.0, cap / (gpu.physical_bytes or gpu.total_bytes)), gpu.index
            )


def detect(spec: FineTuneJobSpec) -> Hardware:
    if spec.resources.gpus == 0:
        return Hardware(gpus=())
    if not torch.cuda.is_available():
        raise TrainerFailure(
            ExitReason.UnsupportedHardware,
            f"spec.resources.gpus is {spec.resources.gpus} but no CUDA GPU is visible "
            "(driver missing or device plugin gave none); use gpus: 0 to train on the CPU",
        )
    gpus = []
    cap = memory_cap_bytes()
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        usable = min(props.total_memory, cap) if cap else props.total_memory
        gpus.append(Gpu(index, props.name, (props.major, props.minor), usable, props.total_memory))
    return Hardware(gpus=tuple(gpus))


def resolve_precision(requested: str, hardware: Hardware) -> ResolvedPrecision:
    """`auto` is fp32 unless every GPU has native bf16; half precision is refused where it breaks."""
    low = hardware.min_capability
    if requested == "auto":
        return "bf16" if low is not None and low >= MIN_BF16_CAPABILITY else "fp32"
    if requested == "bf16" and (low is None or low < MIN_BF16_CAPABILITY):
        where = "the CPU" if low is None else f"compute capability {low[0]}.{low[1]}"
        raise TrainerFailure(
            ExitReason.UnsupportedHardware,
            f"spec.precision bf16 needs compute capability 8.0 or newer, found {where}; use precision: fp32 or auto",
        )
    if requested == "fp16" and (low is None or low < MIN_COMPILER_CAPABILITY):
        where = "the CPU" if low is None else f"compute capability {low[0]}.{low[1]}"
        raise TrainerFailure(
            ExitReason.UnsupportedHardware,
            f"spec.precision fp16 breaks QLoRA on {where} (GradScaler and mixed dtypes); use precision: fp32 or auto",
        )
    if requested in PRECISIONS:
        return requested
    raise TrainerFailure(ExitReason.InvalidConfig, f"spec.precision: unknown value {requested!r}")


def disable_compiler_if_unsupported(hardware: Hardware) -> bool:
    """Keep torch.compile and Triton kernels off below sm_70 and on the CPU; True when switched off.

    On the CPU, bitsandbytes' default backend torch.compiles its 4-bit kernels, which needs a C++
    compiler the runtime image does not have and costs more than it saves on short CPU runs.
    """
    low = hardware.min_capability
    if low is not None and low >= MIN_COMPILER_CAPABILITY:
        return False
    os.environ.update(contract.COMPILER_OFF)
    import torch._dynamo

    torch._dynamo.config.disable = True
    return True


def disable_triton_kernels() -> bool:
    """Keep TRL's Triton loss kernels off (they need sm_70+); True when they are off afterwards.

    TRL decides once, at import, from transformers' `is_triton_available()`; answering it here
    is the narrowest switch that exists.
    """
    import trl.kernels.chunked_logprob as chunked
    import trl.trainer.utils as trl_utils

    chunked._TRITON_AVAILABLE = False
    setattr(trl_utils, "is_triton_available", lambda *args, **kwargs: False)  # noqa: B010
    return not chunked._use_triton(torch.device("cuda"))


def cpu_threads(cpu: str | None, available: int | None = None) -> int:
    """Intra-op threads from the pod's CPU limit (a container sees every core of the node).

    More threads than the CPU quota makes every small matmul wait on throttled spinning
    threads: on two shared cores a 64x64 linear went from 0.17 ms (1 thread) to 6.8 ms (2).
    """
    cores = available or os.cpu_count() or 1
    if not cpu:
        return cores
    try:
        value = float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
    except ValueError:
        return cores
    return max(1, min(cores, int(value)))


def configure_cpu_threads(spec: FineTuneJobSpec, processes: int = 1) -> int:
    """The pod's CPU limit shared by its processes (the launcher would leave each one thread)."""
    threads = max(1, cpu_threads(spec.resources.cpu) // max(1, processes))
    torch.set_num_threads(threads)
    return threads

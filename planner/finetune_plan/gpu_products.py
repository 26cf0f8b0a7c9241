"""GPU products the planner knows: memory PyTorch can use, FP32 peak, memory and link bandwidth,
and the host memory a node of that product offers per GPU.

Names are what GPU Feature Discovery writes into `nvidia.com/gpu.product` (the driver's name
with spaces as dashes) or what `torch.cuda.get_device_name` returns; both are matched.
FP32 peaks are the data-sheet boost figures without TF32, because the recipe runs pure FP32
with TF32 off (Pascal has none); the calibrated utilisation factor maps them to reality.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class GpuProduct:
    name: str
    memory_gib: float  # what torch.cuda.get_device_properties().total_memory reports
    fp32_tflops: float
    memory_gbps: float
    link_gbps: float  # GPU-to-GPU bandwidth one way (PCIe gen3 x16 ~ 12, NVLink more)
    bf16: bool
    # GPU-to-host bandwidth one way, as pinned copies reach it (activation offload): PCIe 3.0 x16
    # about 12 GB/s, 4.0 about 24, 5.0 about 48.
    host_link_gbps: float = 12.0
    # Host memory a trainer pod may take per GPU it asks for, when the chart names no other figure
    # (`trainer.gpu.hostMemoryPerGpu`) and the spec no `resources.memory`: the smallest server
    # commonly sold with the product, less 8 GiB for the kernel, kubelet and daemons, shared by its
    # GPUs, rounded down. Conservative on purpose: a pod above the node's memory never schedules,
    # one below it only offloads fewer activations.
    host_memory_gib: float = 28.0
    # One cuBLAS workspace as PyTorch sizes it by default (CUBLAS_WORKSPACE_CONFIG unset): 32 MiB on
    # Hopper (sm90), two 4 MiB chunks and eight 16 KiB ones before it.
    cublas_workspace_mib: float = 8.125


DEFAULT_PRODUCT: Final = "Tesla-P40"

PRODUCTS: Final[tuple[tuple[str, GpuProduct], ...]] = (
    # (regex on the lower-cased name with spaces/underscores as dashes, product)
    # Pascal and V100-16GB: four cards in 128 GB (or eight in 256 GB): (119 - 8) / 4 GiB.
    (r"tesla-p40", GpuProduct("Tesla-P40", 22.4, 11.76, 346, 12, bf16=False, host_memory_gib=28)),
    (r"tesla-p100.*12gb", GpuProduct("Tesla-P100-PCIE-12GB", 11.9, 9.3, 549, 12, bf16=False, host_memory_gib=28)),
    (r"tesla-p100", GpuProduct("Tesla-P100-PCIE-16GB", 15.9, 9.3, 732, 12, bf16=False, host_memory_gib=28)),
    # V100-32GB: eight in 512 GB (DGX-1): (477 - 8) / 8 GiB.
    (r"tesla-v100.*32gb", GpuProduct("Tesla-V100-32GB", 31.7, 15.7, 900, 25, bf16=False, host_memory_gib=56)),
    (r"tesla-v100", GpuProduct("Tesla-V100-16GB", 15.8, 15.7, 900, 25, bf16=False, host_memory_gib=28)),
    # A100-80GB, H100, H200: eight in 1 TB (HGX boards; DGX has 2 TB): (931 - 8) / 8 GiB.
    # A100-40GB: four in 256 GB: (238 - 8) / 4 GiB.
    (r"a100.*80gb", GpuProduct("NVIDIA-A100-80GB", 79.2, 19.5, 2039, 150, True, 24, host_memory_gib=112)),
    (r"a100", GpuProduct("NVIDIA-A100-40GB", 39.4, 19.5, 1555, 150, True, 24, host_memory_gib=56)),
    (r"h100.*pcie", GpuProduct("NVIDIA-H100-PCIe", 79.2, 51.2, 2000, 64, True, 48, 112, 32)),
    (r"h100", GpuProduct("NVIDIA-H100-80GB-HBM3", 79.2, 67.0, 3350, 225, True, 48, 112, 32)),
    (r"h200", GpuProduct("NVIDIA-H200", 139.8, 67.0, 4800, 225, True, 48, 112, 32)),
)


def _normalise(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


def lookup(name: str) -> GpuProduct | None:
    key = _normalise(name)
    for pattern, product in PRODUCTS:
        if re.search(pattern, key):
            return product
    return None


def known_names() -> list[str]:
    return [p.name for _, p in PRODUCTS]

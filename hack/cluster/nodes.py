"""The cluster's nodes as plain objects: fake GPU nodes for KWOK and the agent's CPU node.

GPU nodes carry the labels GPU Feature Discovery puts on real ones, `nvidia.com/gpu` in
capacity, and the taint GPU pools use, so nodeSelector, tolerations and GPU counts decide
placement through the real scheduler. A Node may be created with its status (capacity),
which is how KWOK's own examples register nodes.
"""

from dataclasses import dataclass
from typing import Any

from .layout import LOCAL_NODE, LOCAL_NODES

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}


@dataclass(frozen=True)
class GpuProduct:
    product: str
    family: str
    memory_mib: int
    compute_major: int
    compute_minor: int


TESLA_P40 = GpuProduct("Tesla-P40", "pascal", 24576, 6, 1)
A100 = GpuProduct("NVIDIA-A100-SXM4-80GB", "ampere", 81920, 8, 0)


@dataclass(frozen=True)
class NodePool:
    prefix: str
    count: int
    product: GpuProduct
    gpus_per_node: int


GPU_POOLS = (NodePool("gpu-p40", 4, TESLA_P40, 4), NodePool("gpu-a100", 1, A100, 4))


def gfd_labels(product: GpuProduct, count: int) -> dict[str, str]:
    return {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product.product,
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.memory": str(product.memory_mib),
        "nvidia.com/gpu.family": product.family,
        "nvidia.com/gpu.compute.major": str(product.compute_major),
        "nvidia.com/gpu.compute.minor": str(product.compute_minor),
        "nvidia.com/gpu.machine": "kwok-fake",
        "nvidia.com/cuda.driver.major": "535",
        "nvidia.com/cuda.driver.minor": "183",
        "nvidia.com/cuda.driver.rev": "01",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "2",
    }


def _node(name: str, labels: dict[str, str], capacity: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **labels,
            },
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def gpu_node(name: str, product: GpuProduct, gpus: int) -> dict[str, Any]:
    node = _node(
        name,
        {"type": "kwok", **gfd_labels(product, gpus)},
        {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "1Ti", GPU_RESOURCE: str(gpus)},
    )
    node["metadata"]["annotations"] = {KWOK_ANNOTATION: "fake"}
    node["spec"]["taints"] = [dict(GPU_TAINT)]
    return node


def gpu_nodes() -> list[dict[str, Any]]:
    return [
        gpu_node(f"{pool.prefix}-{index}", pool.product, pool.gpus_per_node)
        for pool in GPU_POOLS
        for index in range(pool.count)
    ]


# On the agent's nodes other than local-0: a pod lands there only when it tolerates this.
LOCAL_EXTRA_TAINT = {"key": "finetune.dev/local-node", "value": "extra", "effect": "NoSchedule"}


def local_node(name: str = LOCAL_NODE) -> dict[str, Any]:
    """An agent's node: GPU-less, so CPU pods (the operator, CPU trainer runs) land on local-0,
    the only one untainted; the others take the pods that tolerate LOCAL_EXTRA_TAINT.

    Its capacity is generous rather than this machine's: it exists so that placement never
    blocks a test, not to model the host.
    """
    node = _node(
        name,
        {"type": "local", "finetune.dev/node-agent": "true"},
        {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"},
    )
    if name != LOCAL_NODE:
        node["spec"]["taints"] = [dict(LOCAL_EXTRA_TAINT)]
    return node


def local_nodes() -> list[dict[str, Any]]:
    return [local_node(name) for name in LOCAL_NODES]

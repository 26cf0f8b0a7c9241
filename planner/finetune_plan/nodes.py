"""Whether any node of a job's GPU product can ever hold its pods: the one answer `ftjob plan` and
the operator both give.

A job whose pod asks more GPUs than any node of its product has, or a product no node carries,
stays Pending for ever: the scheduler says only `Insufficient nvidia.com/gpu` and tries again.
`room` says why no node will ever do and what would (the same GPUs as more pods of fewer GPUs,
or another product), from the nodes' facts alone: pure, no I/O. `ftjob plan` hands it the nodes
it read from the cluster, or, where it reaches none, `product_nodes`: one server of the product
of GPUS_PER_SERVER GPUs, counted as many as needed (its host memory is the plan's to check).
The operator hands it the Nodes of its watch cache. Both read a Node's body with `facts`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from finetune_api.quantities import to_bytes
from finetune_api.spec import FineTuneJobSpec

from .memory import GIB

# The label GPU Feature Discovery writes, which the operator's pods select on by default, and the
# device plugin's resource.
PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
GPU_RESOURCE: Final = "nvidia.com/gpu"
# Most servers of any of the table's products hold 8 GPUs (a P40 or V100 4U server, an HGX board):
# where no cluster is reached, no pod of more fits one node.
GPUS_PER_SERVER: Final = 8

# The reasons of a verdict (one CamelCase word each, as a condition's reason).
FITS: Final = "NodesFit"
NO_PRODUCT: Final = "NoNodeOfProduct"
TOO_MANY_GPUS: Final = "TooManyGpusPerNode"
TOO_FEW_NODES: Final = "TooFewNodes"
TOO_LITTLE_MEMORY: Final = "TooLittleHostMemory"


@dataclass(frozen=True)
class NodeFacts:
    """One node as the verdict reads it: its product label's value and what it can allocate."""

    name: str
    product: str
    gpus: int
    memory_bytes: int = 0  # allocatable host memory; 0: not known


@dataclass(frozen=True)
class Nodes:
    """The nodes a verdict is made against. `counted`: these are all the nodes there are (read
    from a cluster), not one server standing for as many as a job needs (the planner's figures)."""

    facts: tuple[NodeFacts, ...]
    source: str
    counted: bool = True
    label: str = PRODUCT_LABEL


@dataclass(frozen=True)
class Room:
    fits: bool
    reason: str
    message: str


def _count(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:  # a quantity the device plugin would not write: no GPU
        return 0


def _bytes(value: Any) -> int:
    try:
        return to_bytes(str(value))
    except ValueError:
        return 0


def facts(node: Mapping[str, Any], label: str = PRODUCT_LABEL, resource: str = GPU_RESOURCE) -> NodeFacts | None:
    """A Node's body (as the API serves it) as the verdict reads it: its product and allocatable
    GPUs and memory; None for a node without the label. A cordoned node counts as it is: cordons
    pass, and the verdict is about what can ever run."""
    meta = node.get("metadata") or {}
    product = (meta.get("labels") or {}).get(label)
    if not product:
        return None
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    gpus, memory = _count(allocatable.get(resource, 0)), _bytes(allocatable.get("memory", "0"))
    return NodeFacts(str(meta.get("name") or ""), str(product), gpus, memory)


def product_nodes(product: str, label: str = PRODUCT_LABEL) -> Nodes:
    """Where no cluster is reached: a server of `product` of GPUS_PER_SERVER GPUs, as many as a
    job needs. Its host memory is left to the plan, which holds the pod to the product's figure
    per GPU (`host_memory_gib`, or the chart's `trainer.gpu.hostMemoryPerGpu`)."""
    server = NodeFacts(f"a {product} server", product, GPUS_PER_SERVER)
    return Nodes((server,), f"the planner's figure of {GPUS_PER_SERVER} GPUs a server", counted=False, label=label)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _pool(mine: Sequence[NodeFacts], nodes: Nodes) -> str:
    """`4 nodes of 4 GPUs, the cluster's nodes` or `3 nodes: 8, 4 and 4 GPUs, ...`; not counted,
    only where the figure comes from."""
    sizes = sorted((n.gpus for n in mine), reverse=True)
    if not nodes.counted:
        return nodes.source
    if len(set(sizes)) == 1:
        return f"{_plural(len(sizes), 'node')} of {_plural(sizes[0], 'GPU')}, {nodes.source}"
    return f"{_plural(len(sizes), 'node')}: {', '.join(map(str, sizes[:-1]))} and {sizes[-1]} GPUs, {nodes.source}"


def split(total: int, gpus: Sequence[int], counted: bool) -> tuple[int, int] | None:
    """(nodes, GPUs per node) giving `total` GPUs on the fewest nodes, each node among `gpus` (the
    nodes' GPU counts, one per node; `counted` False: as many of each as needed); None if none do."""
    for per_node in range(max(gpus, default=0), 0, -1):
        if total % per_node:
            continue
        pods = total // per_node
        holders = sum(1 for g in gpus if g >= per_node)
        if holders and (not counted or holders >= pods):
            return pods, per_node
    return None


def _elsewhere(nodes: Nodes, product: str, per_pod: int, pods: int) -> str:
    """Other products with enough nodes that hold a pod: `or resources.gpuProduct: X (...)`."""
    holders: Counter[str] = Counter()
    most: dict[str, int] = {}
    for node in nodes.facts:
        if node.product != product and node.gpus >= per_pod:
            holders[node.product] += 1
            most[node.product] = max(most.get(node.product, 0), node.gpus)
    others = {name: most[name] for name, count in holders.items() if not nodes.counted or count >= pods}
    if not others:
        return "or another resources.gpuProduct"
    named = ", ".join(f"{name} (nodes of up to {gpus} GPUs)" for name, gpus in sorted(others.items()))
    return f"or resources.gpuProduct: {named}"


def _fix(spec: FineTuneJobSpec, nodes: Nodes, mine: Sequence[NodeFacts]) -> str:
    """What would run the same GPUs here: more pods of fewer GPUs, else the most the product has."""
    total = spec.resources.gpus * spec.resources.nodes
    found = split(total, [n.gpus for n in mine], nodes.counted)
    product = spec.resources.gpu_product
    if found is not None:
        pods, per_node = found
        way = f"resources.nodes: {pods} with gpus: {per_node} (the same {total} GPUs)"
    elif nodes.counted:
        most = sum(n.gpus for n in mine)
        way = f"at most {most} GPUs of {product} here, e.g. resources.gpus: {max(n.gpus for n in mine)}"
    else:
        way = f"resources.gpus: {max(n.gpus for n in mine)} or fewer per node"
    return f"{way}; {_elsewhere(nodes, product, spec.resources.gpus, spec.resources.nodes)}"


def _no_product(spec: FineTuneJobSpec, nodes: Nodes) -> Room:
    counts = Counter(n.product for n in nodes.facts)
    have = ", ".join(f"{value} x {count}" for value, count in sorted(counts.items(), key=lambda i: (-i[1], i[0])))
    said = f"nodes have: {have}" if have else f"no node has the {nodes.label} label"
    message = f"no node has {nodes.label}={spec.resources.gpu_product} ({said}); set resources.gpuProduct to one"
    return Room(False, NO_PRODUCT, message + (" of them" if have else " the nodes carry"))


def room(spec: FineTuneJobSpec, nodes: Nodes, pod_memory_bytes: int | None = None) -> Room | None:
    """Whether some node of the spec's product can hold each of its pods (its GPUs and, when
    known, `pod_memory_bytes` of host memory) and enough of them for `resources.nodes` pods; why
    not and what would, in one line. None for a CPU job: no GPU node is asked for."""
    per_pod, pods, product = spec.resources.gpus, spec.resources.nodes, spec.resources.gpu_product
    if per_pod < 1:
        return None
    mine = [n for n in nodes.facts if n.product == product]
    if not mine:
        return _no_product(spec, nodes)
    largest = max(n.gpus for n in mine)
    if largest < per_pod:
        message = (
            f"{per_pod} GPUs per pod: no {product} node has more than {largest} ({_pool(mine, nodes)}); "
            f"{_fix(spec, nodes, mine)}"
        )
        return Room(False, TOO_MANY_GPUS, message)
    wide = [n for n in mine if n.gpus >= per_pod]
    holders = [n for n in wide if not pod_memory_bytes or not n.memory_bytes or n.memory_bytes >= pod_memory_bytes]
    if not holders and pod_memory_bytes:
        most = max(n.memory_bytes for n in wide) / GIB
        message = (
            f"the pod asks {pod_memory_bytes / GIB:.1f} GiB of host memory (resources.memory, or the plan's figure): "
            f"no {product} node with {per_pod} GPUs has more than {most:.1f} GiB allocatable ({nodes.source}); "
            "lower resources.memory, or fewer GPUs per pod"
        )
        return Room(False, TOO_LITTLE_MEMORY, message)
    if nodes.counted and len(holders) < pods:
        message = (
            f"{pods} pods of {per_pod} GPUs: only {_plural(len(holders), 'node')} of {product} can hold one "
            f"({_pool(mine, nodes)}); {_fix(spec, nodes, holders)}"
        )
        return Room(False, TOO_FEW_NODES, message)
    where = f"{_plural(len(holders), 'node')} of {product}" if nodes.counted else f"one {product} server"
    return Room(True, FITS, f"{where} can hold a pod of {_plural(per_pod, 'GPU')} ({nodes.source})")

"""The most host memory a trainer pod may have, and where that figure comes from.

A pod asks for its trainers' host memory (`need`); offloaded activations, pinned, are most of
it, and `activationOffload: auto` would pin far more than a node has (13B on 4 x P40: 55 GiB per
process). The plan therefore pins only what fits a limit: the spec's `resources.memory` when it
sets one; in the pod, the container's memory limit (what the operator gave it); else what a node
of the GPU product offers for the pod's GPUs: the chart's `trainer.gpu.hostMemoryPerGpu` for that
product, or the product's default (`GpuProduct.host_memory_gib`). Each names the field that
raises it, for the one-line refusal when nothing fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from finetune_api.quantities import to_bytes
from finetune_api.spec import FineTuneJobSpec

from ..gpu_products import GpuProduct
from ..memory import GIB
from .need import whole_gib

SPEC_FIELD: Final = "spec.resources.memory"
CHART_FIELD: Final = "trainer.gpu.hostMemoryPerGpu"


@dataclass(frozen=True)
class HostLimit:
    """`limit` bytes for the pod, as `source` says (`describe`), `detail` how it is made up;
    `fields`: what raises it."""

    limit: float
    source: str
    fields: tuple[str, ...]
    detail: str = ""
    from_spec: bool = False

    def describe(self) -> str:
        return f"the {self.limit / GIB:g} GiB {self.source}"

    def holds(self, pod_bytes: float) -> bool:
        """Whether a pod of `pod_bytes` fits, as the operator writes its figure: whole GiB,
        rounded up (`need.HostNeed.quantity`)."""
        return whole_gib(pod_bytes) * GIB <= self.limit

    @property
    def raise_it(self) -> str:
        """`raise spec.resources.memory` and the like, for a refusal."""
        return "raise " + " or ".join(self.fields)


def spec_limit(limit: float) -> HostLimit:
    return HostLimit(limit, f"of {SPEC_FIELD}", (SPEC_FIELD,), from_spec=True)


def pod_limit(limit: float) -> HostLimit:
    """The container's own memory limit, read in the pod: the operator sized it from this plan
    (or from the chart's `trainer.defaultResources.memory` for a model it could not plan)."""
    return HostLimit(limit, "of the pod's memory limit", (SPEC_FIELD,))


def node_limit(gpus: int, product: GpuProduct, per_gpu: float | None = None) -> HostLimit:
    """What a node of `product` offers a pod of `gpus` GPUs: `per_gpu` bytes each (the chart's
    figure), else the product's default."""
    each = per_gpu if per_gpu is not None else product.host_memory_gib * GIB
    return HostLimit(
        gpus * each,
        f"a {product.name} node offers {gpus} GPU{'' if gpus == 1 else 's'}",
        (SPEC_FIELD, f"{CHART_FIELD} where the nodes have more"),
        f"{gpus} x {each / GIB:g} GiB, " + ("" if per_gpu is not None else "the product's default for ") + CHART_FIELD,
    )


def pod_host_limit(
    spec: FineTuneJobSpec, gpus: int, product: GpuProduct, host_memory: int | None, per_gpu: int | None
) -> HostLimit:
    """The pod's most host memory: the spec's `resources.memory`, else `host_memory` (the pod's
    own limit, read in the pod), else `per_gpu` bytes per GPU (the chart's figure for the
    product; default: the product's)."""
    if spec.resources.memory is not None:
        return spec_limit(to_bytes(spec.resources.memory))
    if host_memory is not None:
        return pod_limit(host_memory)
    return node_limit(gpus, product, per_gpu)

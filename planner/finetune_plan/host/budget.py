"""The pod's host memory held to its limit: whether a plan's pod fits it, and how many layers
offload may pin under it.

`activationOffload: auto` pins only as many layers as fit the limit with the rest of the pod
(those just before the kept ones offload, the first ones recompute); a plan whose pod is above
what a node offers does not fit. A limit the spec sets (`resources.memory`) is the pod's own: a
pod above it is refused by `messages.host.shortfall`, not here.
"""

from __future__ import annotations

from dataclasses import replace

from finetune_api.modes import processes, to_spec

from ..memory import Recipe
from ..model_shape import ModelShape
from ..speed import Mode
from .limit import HostLimit
from .need import HostNeed, per_process_within, pod_bytes
from .pinned import pinned_layer_bytes
from .process import host_bytes_per_process


def allows(shape: ModelShape, recipe: Recipe, mode: Mode, gpus: int, limit: HostLimit | None) -> bool:
    """Whether the pod's host memory holds the plan's pinned activations (no limit: always)."""
    return limit is None or limit.holds(pod_bytes(shape, recipe, mode, gpus))


def refused(need: HostNeed, limit: HostLimit | None) -> bool:
    """Whether the pod needs more host memory than a node offers (a limit the spec sets is the
    pod's own, refused apart)."""
    return limit is not None and not limit.from_spec and not limit.holds(need.pod_bytes)


def most_offloaded(shape: ModelShape, recipe: Recipe, mode: Mode, gpus: int, limit: HostLimit) -> int:
    """The most layers whose activations, pinned in every process, fit `limit` with the rest
    of the pod (0 when not one does)."""
    room = per_process_within(limit.limit, processes(to_spec(mode), gpus))
    room -= host_bytes_per_process(shape)
    full = pinned_layer_bytes(shape, recipe)
    most = max(0, min(shape.layers, int(room // full))) if full > 0 else shape.layers
    # The pod's figure is rounded up to whole GiB: fewer layers may fit than the division says.
    while most > 0 and not limit.holds(
        pod_bytes(shape, replace(recipe, offload=True, kept_layers=0, max_offloaded=most), mode, gpus)
    ):
        most -= 1
    return most

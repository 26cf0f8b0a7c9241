"""What the operator plans for a trainer pod before it exists: its grace period and its memory.

The operator cannot read a model's files, so it plans only what a spec alone tells: a Hub model,
or a PVC folder named after one, in the planner's table of well-known models (`known_config`).
For those, one `choose()` (the call the trainer makes in the pod) gives the pod's SIGTERM grace
period and its host memory; for the rest the pod gets the defaults and the trainer plans in the pod.

`verdict` is whether the job can run at all, the answer `ftjob plan` prints and the operator acts
on: its GPUs (the plan), its host memory, and the nodes of its product (`nodes.room`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from finetune_api.quantities import to_bytes
from finetune_api.reasons import ExitReason
from finetune_api.spec import FineTuneJobSpec

from .grace import DEFAULT_S, Grace, grace_of
from .host.need import HostNeed
from .messages.host import shortfall
from .model_shape import ModelConfigError, known_model
from .nodes import Nodes, Room, room
from .parallelism import LaunchPlan, choose
from .results.plan import Plan

# The spec asks what no pod of its GPUs can hold: the trainer's own reason, decided before any pod.
WONT_FIT = ExitReason.WontFit.name
FITS = "Fits"


def known_config(spec: FineTuneJobSpec) -> Mapping[str, Any] | None:
    """The model's config.json when it is known without reading the model: a Hub id, or a PVC
    folder named after one (`.../meta-llama/Llama-3.3-70B-Instruct`), in the planner's table."""
    source = spec.model.source
    if source.hub is not None:
        return known_model(source.hub.id)
    if source.pvc is not None:
        parts = [p for p in source.pvc.path.split("/") if p]
        if len(parts) >= 2:
            return known_model("/".join(parts[-2:]))
    return None


@dataclass(frozen=True)
class PodPlan:
    launch: LaunchPlan | None  # None: not planned here (the CPU, or a shape unknown before the pod)
    grace: Grace
    host: HostNeed | None


def pod_plan(
    spec: FineTuneJobSpec, model_config: Mapping[str, Any] | None = None, *, host_memory_per_gpu: int | None = None
) -> PodPlan:
    """The plan of `spec`'s pod (`model_config` default: `known_config(spec)`); `host_memory_per_gpu`:
    what a node offers the pod per GPU (the chart's `trainer.gpu.hostMemoryPerGpu`; default: the
    product's)."""
    config = model_config if model_config is not None else known_config(spec)
    if spec.resources.gpus < 1 or config is None:
        return PodPlan(None, Grace(DEFAULT_S, None, None, None), None)
    try:
        # SDPA's memory-efficient kernel, the trainer's usual attention.
        launch = choose(
            spec, config, spec.resources.gpus, attention="memory_efficient", host_memory_per_gpu=host_memory_per_gpu
        )
    except ModelConfigError:
        return PodPlan(None, Grace(DEFAULT_S, None, None, None), None)
    host = launch.plan.host if launch.plan is not None else None
    return PodPlan(launch, grace_of(launch.plan), host)


def grace_for(spec: FineTuneJobSpec, model_config: Mapping[str, Any] | None = None) -> Grace:
    """The pod's grace period for `spec`."""
    return pod_plan(spec, model_config).grace


def memory_refusal(spec: FineTuneJobSpec, host: HostNeed | None) -> str | None:
    """Why `spec.resources.memory` cannot hold the pod's trainers, or, unset, why a node's host
    memory cannot; None when it can (or the pod is not planned)."""
    if host is None:
        return None
    if spec.resources.memory is None:
        return host.refusal
    return shortfall(host, to_bytes(spec.resources.memory))


@dataclass(frozen=True)
class Verdict:
    """Whether a job can run, the reason (Fits, WontFit or the nodes' `Room` reason) and one line.
    `room` is the nodes' own verdict, None where none was made (a CPU job, no nodes known)."""

    fits: bool
    reason: str
    message: str
    room: Room | None = None

    @property
    def nodes_short(self) -> bool:
        """The cluster's nodes, not the spec's figures, stand in the way: nodes may yet be added
        (the operator warns and waits), where a WontFit is the spec's for good."""
        return not self.fits and self.room is not None and not self.room.fits


def verdict(spec: FineTuneJobSpec, plan: Plan | None, nodes: Nodes | None, pod_memory_bytes: int | None) -> Verdict:
    """The one verdict on `spec`: its host memory (`resources.memory`, or what a node offers,
    against the plan's figure), then its GPUs (`plan`, None where it is not planned), then the
    nodes of its product (`nodes`, None where they are not known; `pod_memory_bytes`: the pod's
    memory limit)."""
    # The host memory first: a `resources.memory` below the pod's figure is the field to change,
    # and it may be what keeps the plan off its GPUs too (the offload it would need).
    short = memory_refusal(spec, plan.host if plan is not None else None)
    if short is not None:
        return Verdict(False, WONT_FIT, short)
    if plan is not None and not plan.fits:
        return Verdict(False, WONT_FIT, plan.message)
    found = room(spec, nodes, pod_memory_bytes) if nodes is not None else None
    if found is not None and not found.fits:
        return Verdict(False, found.reason, found.message, found)
    said = plan.message if plan is not None else found.message if found is not None else "not planned here"
    return Verdict(True, FITS, said, found)

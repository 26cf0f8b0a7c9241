"""The platform team's limits on every job (Settings): pure checks, no I/O, no clock.

Two kinds: limits on what a job asks for, decided before any child exists (a job above one would
hold GPUs another team is promised), and a pending timeout, decided from the pods the job's Job
made: a pod the scheduler keeps refusing waits forever otherwise, and the scheduler's own words
("0/7 nodes are available: ... didn't match Pod's node affinity/selector") never say which label
value was asked for nor which ones the nodes carry.
"""

import datetime
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from finetune_api.spec import FineTuneJobSpec
from finetune_plan.nodes import NodeFacts

from .settings import Settings

# What the pending timeout leaves behind: the job's pods stop (its Job is suspended) and the job
# ends Failed with this reason, for good.
UNSCHEDULABLE = "Unschedulable"


def limit_refusal(spec: FineTuneJobSpec, settings: Settings) -> str | None:
    """Why the job asks for more than one job may have here, naming the field and the limit."""
    nodes, per_node = spec.resources.nodes, spec.resources.gpus
    if settings.max_nodes_per_job is not None and nodes > settings.max_nodes_per_job:
        return (
            f"spec.resources.nodes: {nodes} is above this cluster's limit of "
            f"{settings.max_nodes_per_job} node(s) per job"
        )
    total = per_node * nodes
    if settings.max_gpus_per_job is not None and total > settings.max_gpus_per_job:
        asked = f"{per_node} per node x {nodes} nodes = {total}" if nodes > 1 else str(total)
        return (
            f"spec.resources.gpus: {asked} GPU(s) is above this cluster's limit of "
            f"{settings.max_gpus_per_job} GPU(s) per job"
        )
    return None


def _parse(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _refusal(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The PodScheduled=False (Unschedulable) condition of a pod still waiting for a node."""
    status = pod.get("status") or {}
    if status.get("phase") != "Pending" or (pod.get("spec") or {}).get("nodeName"):
        return None
    return next(
        (
            c
            for c in status.get("conditions") or []
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == UNSCHEDULABLE
        ),
        None,
    )


def unschedulable_since(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """When the longest-refused pending pod was first found unschedulable, or None if none is.
    The PodScheduled condition's lastTransitionTime moves only when its status flips, so it is
    the start of the wait, however often the scheduler tried since."""
    stamps = [str(c["lastTransitionTime"]) for c in map(_refusal, pods) if c and c.get("lastTransitionTime")]
    return min(stamps, key=_parse) if stamps else None


def pending_too_long(pods: Sequence[Mapping[str, Any]], now: str, settings: Settings) -> bool:
    timeout = settings.pending_timeout_seconds
    since = unschedulable_since(pods)
    if timeout is None or since is None:
        return False
    return (_parse(now) - _parse(since)).total_seconds() >= timeout


def _scheduler_said(pods: Sequence[Mapping[str, Any]]) -> str:
    refusals = [c for c in map(_refusal, pods) if c and c.get("message")]
    return str(refusals[0]["message"]) if refusals else "no node fits the pod"


def unschedulable_message(
    spec: FineTuneJobSpec, pods: Sequence[Mapping[str, Any]], nodes: Sequence[NodeFacts] | None, settings: Settings
) -> str:
    """One line: which label value no node carries and the values nodes do carry; or, where the
    product exists (or the job wants no GPU), the scheduler's own reason. `nodes`: those with the
    GPU product label (None: the nodes are not known)."""
    waited = f"pods unschedulable for over {settings.pending_timeout_seconds} s"
    label, product = settings.gpu_product_label, spec.resources.gpu_product
    node_values = Counter(n.product for n in nodes) if nodes is not None else None
    if spec.resources.gpus > 0 and node_values is not None and product not in node_values:
        have = ", ".join(
            f"{value} x {count}" for value, count in sorted(node_values.items(), key=lambda i: (-i[1], i[0]))
        )
        return f"{waited}: no node has {label}={product} (nodes have: {have or f'no {label} label'})"
    return f"{waited}: {_scheduler_said(pods)}"

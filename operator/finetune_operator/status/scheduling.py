"""Whether the job's pods are placed and its trainer runs: one pod, or a gang of `nodes` pods.

A verdict is (scheduled, reason, message) for the Scheduled condition, None when there is
nothing to say yet. A gang is scheduled only when every pod of its attempt is, and its trainer
runs only when every pod runs: until then each launcher waits at the rendezvous.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from .observation import Observation
from .pods import created, pod_condition, terminated

# Scheduled or not, the reason and the message; None: nothing to say yet.
Verdict = tuple[bool, str, str] | None


def active(pods: Sequence[Mapping[str, Any]]) -> bool:
    return any((p.get("status") or {}).get("phase") in ("Pending", "Running") for p in pods)


def scheduling(pods: Sequence[Mapping[str, Any]]) -> Verdict:
    """One pod's placement: the newest pod's, in the scheduler's words when it refuses."""
    live = [p for p in pods if (p.get("status") or {}).get("phase") in ("Pending", "Running")]
    if not live:
        # Ended pods were placed too: a status first written after its pod ended (writes are
        # coalesced) says Scheduled as one written while it ran did.
        placed = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
        if not placed:
            return None
        pod = max(placed, key=created)
        return True, "Scheduled", f"pod {pod['metadata']['name']} is on node {pod['spec']['nodeName']}"
    pod = max(live, key=created)
    cond = pod_condition(pod, "PodScheduled")
    node = (pod.get("spec") or {}).get("nodeName")
    if node or (cond and cond.get("status") == "True"):
        return True, "Scheduled", f"pod {pod['metadata']['name']} is on node {node}"
    if cond and cond.get("status") == "False":
        return False, str(cond.get("reason") or "Unschedulable"), str(cond.get("message") or "")
    return None


def _live(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pods of the current attempt: Pending or Running, their trainer not ended."""
    return [p for p in pods if (p.get("status") or {}).get("phase") in ("Pending", "Running") and terminated(p) is None]


def gang_scheduling(pods: Sequence[Mapping[str, Any]], nodes: int) -> Verdict:
    """A gang is scheduled when every pod of the attempt is; else the first refusal, with a count."""
    live = _live(pods)
    if not live:
        return None
    waiting = [p for p in live if (pod_condition(p, "PodScheduled") or {}).get("status") == "False"]
    if waiting:
        cond = pod_condition(min(waiting, key=created), "PodScheduled") or {}
        reason = str(cond.get("reason") or "Unschedulable")
        said = str(cond.get("message") or "no node fits the pod")
        return False, reason, f"{len(waiting)} of {nodes} pods pending: {said}"
    placed = [p for p in live if (p.get("spec") or {}).get("nodeName")]
    if len(placed) < nodes:
        return None
    where = ", ".join(sorted(str(p["spec"]["nodeName"]) for p in placed))
    return True, "Scheduled", f"{len(placed)} of {nodes} pods are on nodes {where}"


def gang_running(pods: Sequence[Mapping[str, Any]]) -> int:
    """Pods of the current attempt whose container runs (the launcher; the trainer once all do)."""
    return sum(1 for p in _live(pods) if (p.get("status") or {}).get("phase") == "Running")


def trainer_running(obs: Observation, status: dict[str, Any], gang: bool) -> tuple[bool, str | None]:
    """Whether a trainer runs, and for a gang not whole yet why none does (its launchers wait at
    the rendezvous); a gang's status counts its pods running."""
    running = any((p.get("status") or {}).get("phase") == "Running" for p in obs.pods if terminated(p) is None)
    if not gang:
        return running, None
    ready = gang_running(obs.pods)
    status["nodes"] = {"ready": ready, "total": obs.nodes}
    if running and ready < obs.nodes:
        return False, (
            f"{ready} of {obs.nodes} pods running: their launchers wait at the rendezvous "
            "and no trainer starts until every pod of the gang runs"
        )
    return running, None

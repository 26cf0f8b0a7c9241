"""What a ModelServer's status says, from its Deployment and pods: pure functions of plain API dicts.

Phase: Failed when refused (the one line naming the field) or when llama-server cannot start
(its pod restarts: the container's last words); Ready when every replica answers /health;
Loading when a pod runs but its llama-server still reads the model; Pending otherwise (no pod
placed yet, in the scheduler's words: a GPU short says so).

A roll (the adapter list changed) keeps the phase the old pods give it: they serve on until a new
pod is ready. `Progressing` says how the roll stands, False with WaitingForGpu while its new pod
cannot be placed. A pod is the spec's current one when its container's arguments are those the
builder writes for the spec now.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from finetune_api.server_status import ServerConditionType

from ..status.pods import pod_condition

Body = Mapping[str, Any]
REFUSED = "Refused"
CRASHED = "ServerCrashed"
WAITING_FOR_GPU = "WaitingForGpu"
# A container restarted this often without answering /health is not going to.
CRASH_RESTARTS = 2


@dataclass(frozen=True)
class Seen:
    """One reconcile's view of a server: what status.base/adapters list (already resolved), or the
    refusal; the Deployment, its pods, and the arguments of a current pod."""

    generation: int
    now: str
    current: Body
    replicas: int
    endpoint: str
    refusal: tuple[str, str] | None = None  # (reason, message)
    served: Body | None = None  # {"base": ..., "adapters": [...]}
    deployment: Body | None = None
    pods: Sequence[Body] = ()
    args: Sequence[str] = ()


def _condition(kind: ServerConditionType, ok: bool, reason: str, message: str, seen: Seen) -> dict[str, Any]:
    status: Literal["True", "False"] = "True" if ok else "False"
    previous = next((c for c in seen.current.get("conditions") or [] if c.get("type") == kind), None)
    since = previous.get("lastTransitionTime") if previous and previous.get("status") == status else seen.now
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "observedGeneration": seen.generation,
    }


def _current(pod: Body, args: Sequence[str]) -> bool:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return list(containers[0].get("args") or []) == list(args)


def _live(pods: Sequence[Body]) -> list[Body]:
    return [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]


def _ready(pod: Body) -> bool:
    return (pod_condition(pod, "Ready") or {}).get("status") == "True"


def _running(pod: Body) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def _container(pod: Body) -> Body:
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    first: Body = statuses[0]
    return first


def crash(pod: Body) -> str | None:
    """llama-server's last words when its container keeps exiting (a file it cannot load), else None."""
    state = _container(pod)
    if int(state.get("restartCount") or 0) < CRASH_RESTARTS and (pod.get("status") or {}).get("phase") != "Failed":
        return None
    last = (state.get("lastState") or {}).get("terminated") or (state.get("state") or {}).get("terminated") or {}
    lines = [line.strip() for line in str(last.get("message") or "").splitlines() if line.strip()]
    said = " | ".join(lines[-3:]) if lines else f"exit code {last.get('exitCode', '?')}"
    return f"llama-server exited {last.get('exitCode', '?')} ({state.get('restartCount') or 0} restarts): {said}"


def unschedulable(pod: Body) -> str | None:
    """The scheduler's words for a pod it cannot place, or None."""
    condition = pod_condition(pod, "PodScheduled") or {}
    if condition.get("status") == "False":
        return str(condition.get("message") or condition.get("reason") or "no node fits the pod")
    return None


def _phase(seen: Seen, pods: list[Body]) -> tuple[str, str, str | None]:
    """(phase, Ready's reason, message): from the pods of every template, old ones serving on."""
    ready = [p for p in pods if _ready(p)]
    if len(ready) >= seen.replicas:
        return "Ready", "Answering", None
    current = [p for p in pods if _current(p, seen.args)]
    crashed = next((c for p in current if (c := crash(p)) is not None), None)
    if crashed is not None and not ready:
        return "Failed", CRASHED, crashed
    if ready:
        return "Ready", "Answering", f"{len(ready)} of {seen.replicas} pods answer"
    if any(_running(p) for p in pods):
        return "Loading", "Loading", "llama-server is loading the model (/health not yet 200)"
    waiting = next((u for p in pods if (u := unschedulable(p)) is not None), None)
    if waiting is not None:
        return "Pending", "Unschedulable", f"waiting for a node: {waiting}"
    return "Pending", "Pending", "waiting for the server's pods"


def _progressing(seen: Seen, pods: list[Body]) -> dict[str, Any]:
    """How the pods stand against the spec's current arguments (a roll after an adapter change)."""
    current = [p for p in pods if _current(p, seen.args)]
    old = [p for p in pods if not _current(p, seen.args)]
    if not old and len([p for p in current if _ready(p)]) >= seen.replicas:
        return _condition("Progressing", True, "Rolled", "every pod serves the spec's adapters", seen)
    waiting = next((u for p in current if (u := unschedulable(p)) is not None), None)
    if waiting is not None and old:
        text = f"the new pod waits for a GPU ({waiting}); the previous pods serve on"
        return _condition("Progressing", False, WAITING_FOR_GPU, text, seen)
    ready_new = len([p for p in current if _ready(p)])
    text = f"{ready_new} of {seen.replicas} pods serve the spec's adapters"
    return _condition(
        "Progressing", True, "Rolling", text + (f"; {len(old)} previous still serve" if old else ""), seen
    )


def _counts(deployment: Body | None) -> dict[str, int]:
    status = (deployment or {}).get("status") or {}
    return {
        "replicas": int(status.get("replicas") or 0),
        "readyReplicas": int(status.get("readyReplicas") or 0),
        "updatedReplicas": int(status.get("updatedReplicas") or 0),
    }


def compute(seen: Seen) -> dict[str, Any]:
    """The whole status the operator writes."""
    status: dict[str, Any] = {"observedGeneration": seen.generation, "endpoint": seen.endpoint}
    if seen.refusal is not None:
        reason, message = seen.refusal
        status.update(phase="Failed", message=message)
        status["conditions"] = [
            _condition("Validated", False, reason, message, seen),
            _condition("Ready", False, reason, message, seen),
        ]
        return status
    status.update(seen.served or {})
    status.update(_counts(seen.deployment))
    pods = _live(seen.pods)
    phase, reason, said = _phase(seen, pods)
    status.update(phase=phase, message=said)
    validated = _condition("Validated", True, "Valid", "the spec, its jobs and its claims are servable", seen)
    ready = _condition("Ready", phase == "Ready", reason, said or "every pod answers", seen)
    status["conditions"] = [validated, ready, _progressing(seen, pods)]
    return status


def transitions(before: Body, after: Body) -> list[tuple[str, str]]:
    """(reason, message) of a Warning worth posting: the server became Failed, or a roll began to
    wait for a GPU."""
    out: list[tuple[str, str]] = []
    if after.get("phase") == "Failed" and before.get("phase") != "Failed":
        failed: Body = next((c for c in after.get("conditions") or [] if c.get("type") == "Ready"), {})
        out.append((str(failed.get("reason") or REFUSED), str(after.get("message") or "")))

    def waiting(status: Body) -> Body | None:
        return next(
            (
                c
                for c in status.get("conditions") or []
                if c.get("type") == "Progressing" and c.get("reason") == WAITING_FOR_GPU
            ),
            None,
        )

    if (now := waiting(after)) is not None and waiting(before) is None:
        out.append((WAITING_FOR_GPU, str(now.get("message") or "")))
    return out

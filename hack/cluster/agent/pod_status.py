"""Pod status as the kubelet reports it, built from what the agent knows (pure)."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

HOST_IP = "127.0.0.1"
# The kubelet keeps at most this much of a termination message.
MAX_MESSAGE = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Waiting:
    reason: str
    message: str = ""


@dataclass(frozen=True)
class Running:
    started_at: str
    pid: int


@dataclass(frozen=True)
class Terminated:
    exit_code: int
    reason: str
    message: str
    started_at: str
    finished_at: str
    pid: int = 0


ContainerState = Waiting | Running | Terminated


def termination_reason(exit_code: int) -> str:
    return "Completed" if exit_code == 0 else "Error"


def termination_message(log_file_text: str, container: Mapping[str, Any], exit_code: int, log_tail: str) -> str:
    """The termination log's content; with FallbackToLogsOnError, the log's tail when that is empty and it failed."""
    message = log_file_text[:MAX_MESSAGE]
    if not message.strip() and exit_code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
        lines = log_tail.splitlines()[-FALLBACK_LOG_LINES:]
        message = "\n".join(lines)[-FALLBACK_LOG_BYTES:]
    return message


def _terminated(state: Terminated) -> dict[str, Any]:
    terminated: dict[str, Any] = {
        "exitCode": state.exit_code,
        "reason": state.reason,
        "startedAt": state.started_at,
        "finishedAt": state.finished_at,
    }
    if state.message:
        terminated["message"] = state.message
    if state.pid:
        terminated["containerID"] = f"agent://{state.pid}"
    return terminated


def container_status(
    container: Mapping[str, Any],
    state: ContainerState,
    restarts: int = 0,
    last: Terminated | None = None,
    probed: bool | None = None,
) -> dict[str, Any]:
    """`probed`: the readiness probe's last verdict (probes.py), None for a container without one."""
    status: dict[str, Any] = {
        "name": container["name"],
        "image": container.get("image", ""),
        "imageID": "",
        "restartCount": restarts,
        "ready": isinstance(state, Running) and probed is not False,
        "started": isinstance(state, Running),
    }
    if isinstance(state, Waiting):
        status["state"] = {"waiting": {"reason": state.reason, **({"message": state.message} if state.message else {})}}
    elif isinstance(state, Running):
        status["containerID"] = f"agent://{state.pid}"
        status["state"] = {"running": {"startedAt": state.started_at}}
    else:
        if state.pid:
            status["containerID"] = f"agent://{state.pid}"
        status["state"] = {"terminated": _terminated(state)}
    if last is not None:
        status["lastState"] = {"terminated": _terminated(last)}
    return status


def _condition(kind: str, value: bool, reason: str = "", existing: Mapping[str, Any] | None = None) -> dict[str, Any]:
    status = "True" if value else "False"
    keep = existing is not None and existing.get("status") == status
    condition: dict[str, Any] = {
        "type": kind,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": existing["lastTransitionTime"] if keep and existing else now(),
    }
    if reason:
        condition["reason"] = reason
    return condition


def pod_status(
    pod: Mapping[str, Any],
    phase: str,
    init_states: Sequence[ContainerState],
    states: Sequence[ContainerState],
    *,
    start_time: str,
    message: str = "",
    reason: str = "",
    restarts: Mapping[str, tuple[int, Terminated]] | None = None,
    pod_ip: str = HOST_IP,
    probed: Mapping[str, bool] | None = None,
) -> dict[str, Any]:
    """The whole status, for a merge patch: conditions keep what others set (PodScheduled, DisruptionTarget).
    `probed`: the readiness probes' verdicts by container (those without a probe are ready while they run)."""
    spec = pod["spec"]
    probed = probed or {}
    existing = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
    initialized = all(isinstance(s, Terminated) and s.exit_code == 0 for s in init_states)
    ready = phase == "Running" and all(
        isinstance(s, Running) and probed.get(c["name"]) is not False
        for c, s in zip(spec["containers"], states, strict=True)
    )
    done_reason = {"Succeeded": "PodCompleted", "Failed": "PodFailed"}.get(phase, "ContainersNotReady")
    ours = {
        "PodReadyToStartContainers": _condition("PodReadyToStartContainers", phase != "Pending" or bool(states),
                                                existing=existing.get("PodReadyToStartContainers")),
        "Initialized": _condition("Initialized", initialized, "" if initialized else "ContainersNotInitialized",
                                  existing.get("Initialized")),
        "Ready": _condition("Ready", ready, "" if ready else done_reason, existing.get("Ready")),
        "ContainersReady": _condition("ContainersReady", ready, "" if ready else done_reason,
                                      existing.get("ContainersReady")),
    }  # fmt: skip
    conditions = [c for kind, c in existing.items() if kind not in ours] + list(ours.values())
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": HOST_IP,
        "hostIPs": [{"ip": HOST_IP}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": start_time,
        "qosClass": (pod.get("status") or {}).get("qosClass", "BestEffort"),
        "containerStatuses": [
            container_status(c, s, *(restarts or {}).get(c["name"], (0, None)), probed=probed.get(c["name"]))
            for c, s in zip(spec["containers"], states, strict=True)
        ],
        "message": message or None,
        "reason": reason or None,
    }
    if spec.get("initContainers"):
        status["initContainerStatuses"] = [
            container_status(c, s) for c, s in zip(spec["initContainers"], init_states, strict=True)
        ]
    return status

"""Jobs and pods as the API server writes them, for the status logic's tests."""

NOW = "2026-01-01T00:00:10Z"


def job(*, failed=0, conditions=(), suspend=False, start="2026-01-01T00:00:00Z", completion=None):
    status = {"failed": failed, "conditions": [dict(c) for c in conditions], "startTime": start}
    if completion:
        status["completionTime"] = completion
    return {"metadata": {"uid": "job-uid"}, "spec": {"suspend": suspend}, "status": status}


def cond(kind, reason="", message="", status="True"):
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-01-01T00:00:09Z",
    }


def pod(
    name,
    phase,
    *,
    exit_code=None,
    term_message=None,
    term_reason=None,
    scheduled=None,
    node=None,
    created="2026-01-01T00:00:01Z",
):
    status = {"phase": phase, "conditions": []}
    if scheduled is not None:
        ok, reason, message = scheduled
        status["conditions"].append(
            {"type": "PodScheduled", "status": "True" if ok else "False", "reason": reason, "message": message}
        )
    if exit_code is not None:
        term = {"exitCode": exit_code, "reason": term_reason or ("Completed" if exit_code == 0 else "Error")}
        if term_message:
            term["message"] = term_message
        status["containerStatuses"] = [{"name": "trainer", "state": {"terminated": term}}]
    spec = {"nodeName": node} if node else {}
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": spec, "status": status}

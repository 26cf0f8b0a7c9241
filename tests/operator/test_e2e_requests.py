"""What one job costs the API server over its whole life, as the operator counts it
(finetune_api_requests_total), and what its user reads meanwhile, on the control plane with a
fake GPU node (KWOK) running the pod.

At most 4 requests a job (#43): its Job, and a status write for each state that stands (here
Running, while the trainer runs for longer than the coalescing window, and Succeeded). What the
namespace's jobs share (the trainer identity, the trainers' NetworkPolicies) is made once, when
the operator starts, and is no job's cost. The status the user ends with is the one the operator
writes when it writes every change at once (statusCoalesceSeconds 0, how it wrote before
coalescing), less the moments and the names of pods and nodes.
"""

import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from tests.reliability.cluster_kit import PodAnnotator
from tests.support.harness import Jobs, OperatorProcess, wait_for
from tests.support.install import make_claim, wait_bound
from tests.support.specs import gpu_spec

pytestmark = pytest.mark.cluster

# Longer than the coalescing window (5 s): the user must see the job Running while it runs.
RUN = "12s"
BUDGET = 4


def _spec() -> dict[str, Any]:
    spec = gpu_spec()
    spec["output"] = {"pvc": {"claimName": "outputs"}}  # the user's claim: no child of the job's
    return spec


def _shared_made(operator: OperatorProcess) -> dict[str, float] | None:
    """The operator's count once the namespace's shared children are made (at its start)."""
    counts = operator.requests()
    return counts if counts.get("create NetworkPolicy", 0) >= 2 and counts.get("create RoleBinding", 0) >= 1 else None


def _live(
    jobs: Jobs, kube: client.ApiClient, name: str, timeout: float
) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """Create the job, its pod kept Running for RUN; (each (phase, Running reason) the user could
    read, in order, the final status)."""
    seen: list[tuple[str, str]] = []
    with PodAnnotator(kube, jobs.namespace, {name}, {"kwok.finetune.dev/run-ms": RUN}):
        jobs.create(name, _spec())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = jobs.status(name)
            running = next((c for c in status.get("conditions") or [] if c["type"] == "Running"), {})
            now = (str(status.get("phase")), str(running.get("reason")))
            if status and (not seen or seen[-1] != now):
                seen.append(now)
            if status.get("phase") in ("Succeeded", "Failed"):
                return seen, status
            time.sleep(0.2)
    raise AssertionError(f"{name} did not finish in {timeout}s; seen {seen}")


def _as_read(status: dict[str, Any], name: str) -> dict[str, Any]:
    """What a user reads, less the moments a write stamps and the names of the job, its pod and
    its node (two jobs of one spec differ there and nowhere else)."""

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: plain(v) for k, v in value.items() if k not in ("lastTransitionTime", "startTime", "completionTime")
            }
        if isinstance(value, list):
            return [plain(v) for v in value]
        if isinstance(value, str):
            value = re.sub(rf"\b{re.escape(name)}(-[a-z0-9-]+)?", "<job>", value)
            return re.sub(r"node \S+", "node <node>", value)
        return value

    ours = {k: v for k, v in status.items() if k not in ("progress", "lastCheckpoint")}
    return {**plain(ours), "times": sorted(k for k in ("startTime", "completionTime") if status.get(k))}


def test_a_jobs_whole_life_costs_at_most_four_requests_and_reads_as_before(
    jobs: Jobs, kube: client.ApiClient, core: client.CoreV1Api, start_operator: Callable[..., OperatorProcess]
) -> None:
    make_claim(core, jobs.namespace, "outputs")
    wait_bound(core, jobs.namespace, "outputs")

    coalescing = start_operator()
    before = wait_for(lambda: _shared_made(coalescing), 60, "the namespace's shared children")
    phases, status = _live(jobs, kube, "life", 120)
    # Anything the end still owed (an Event, a late write) lands within the window.
    time.sleep(7)
    after = coalescing.requests()
    cost = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert sum(cost.values()) <= BUDGET, cost
    assert cost.get("create Job") == 1, cost
    # No NetworkPolicy (the namespace's), no Event (nothing went wrong), no read of what the
    # watches hold: the Job and the status writes are all a job costs.
    assert set(cost) <= {"create Job", "patch FineTuneJob/status"}, cost
    assert status["phase"] == "Succeeded"
    # The user saw it run while it ran, and the end.
    assert ("Running", "TrainerRunning") in phases, phases
    assert phases[-1][0] == "Succeeded", phases
    assert jobs.operator_events("life", settle_s=0) == []
    coalescing.stop()

    stepwise = start_operator(env={"FINETUNE_STATUS_COALESCE_SECONDS": "0"})
    _, written_each_time = _live(jobs, kube, "stepwise", 120)
    assert stepwise.requests().get("patch FineTuneJob/status", 0) >= cost["patch FineTuneJob/status"]
    assert _as_read(status, "life") == _as_read(written_each_time, "stepwise")

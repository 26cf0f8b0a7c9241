"""A job of two nodes under the real Kueue: queued and admitted as one gang (one Workload whose
pod set counts both pods; both pods or none), preempted whole by a job of higher priority, and
admitted again, still as one gang, to finish. The pods run on KWOK's fake P40 nodes (four GPUs
each), so the gang is two nodes' worth of GPUs, and the quota holds one such gang or less.
"""

from typing import Any

import pytest
from kubernetes import client

from tests.fixtures.kueue import KueueObjects
from tests.operator.test_e2e_kueue import PLENTY, QUEUE, cluster_queue, local_queue, p40_flavor
from tests.reliability.cluster_kit import PodAnnotator
from tests.support.harness import Jobs, OperatorProcess, wait_for
from tests.support.specs import gpu_spec

pytestmark = pytest.mark.cluster

# Long enough that the gang is still running when the urgent job arrives; short enough to rerun.
GANG_RUN = "20s"
URGENT_RUN = "20s"


def _live(jobs: Jobs, name: str) -> list[dict[str, Any]]:
    return [
        p
        for p in jobs.pods(name)
        if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") in ("Pending", "Running")
    ]


def _workloads_of(kueue_objects: KueueObjects, namespace: str, job_uid: str) -> list[dict[str, Any]]:
    return [
        w
        for w in kueue_objects.list("workloads", namespace)
        if any(r.get("uid") == job_uid for r in w["metadata"].get("ownerReferences") or [])
    ]


def test_a_two_node_job_is_one_gang_admitted_preempted_and_admitted_again_whole(
    kube: client.ApiClient, namespace: str, jobs: Jobs, kueue_objects: KueueObjects, operator: OperatorProcess
) -> None:
    flavor = p40_flavor(kueue_objects, namespace)
    # Room for the gang (2 x 4 GPUs) and nothing beside it; a higher priority takes it over.
    quota = {**PLENTY, "nvidia.com/gpu": "8"}
    kueue_objects.create(cluster_queue(namespace, flavor, quota, preemption={"withinClusterQueue": "LowerPriority"}))
    for name, value in (("low", 100), ("high", 1000)):
        kueue_objects.create(
            {"kind": "WorkloadPriorityClass", "metadata": {"name": f"{namespace}-{name}"}, "value": value}
        )

    def placed(priority: str) -> dict[str, str]:
        return {"queueName": QUEUE, "workloadPriorityClassName": f"{namespace}-{priority}"}

    gang_spec = {**gpu_spec(placement=placed("low")), "resources": {"gpus": 4, "nodes": 2, "cpu": "2", "memory": "8Gi"}}
    # No LocalQueue yet: Kueue holds the Workload, so the Job's pods can be told to run a while.
    jobs.create("gang", gang_spec)
    jobs.wait_phase("gang", "Queued", 60)
    job = wait_for(lambda: jobs.batch.read_namespaced_job("gang", namespace), 30, "the gang's Job")
    template = {"spec": {"template": {"metadata": {"annotations": {"kwok.finetune.dev/run-ms": GANG_RUN}}}}}
    jobs.batch.patch_namespaced_job("gang", namespace, template)
    assert not jobs.pods("gang"), "a queued gang has pods"

    kueue_objects.create(local_queue(namespace, namespace))
    # Admitted: one Workload whose one pod set counts both pods, and both pods at once.
    (workload,) = wait_for(lambda: _workloads_of(kueue_objects, namespace, job.metadata.uid), 60, "the Workload")
    assert [s["count"] for s in workload["spec"]["podSets"]] == [2], workload["spec"]["podSets"]
    running = jobs.wait_phase("gang", "Running", 60)
    assert running["queue"]["admitted"] is True

    def both_placed() -> list[dict[str, Any]] | None:
        live = _live(jobs, "gang")
        return live if len(live) == 2 and all(p["spec"].get("nodeName") for p in live) else None

    pods = wait_for(both_placed, 60, "both pods of the gang placed")
    # Four GPUs each, on nodes of four: two nodes.
    assert len({p["spec"]["nodeName"] for p in pods}) == 2, [p["spec"]["nodeName"] for p in pods]

    # The urgent job holds the quota for URGENT_RUN: the gang's wait stands past the operator's
    # status window (a state of 2 s is never written, by design), so Queued is there to read.
    with PodAnnotator(kube, namespace, {"urgent"}, {"kwok.finetune.dev/run-ms": URGENT_RUN}):
        jobs.create("urgent", gpu_spec(gpus=4, placement=placed("high")))
        # Preempted whole: the gang's Workload gives both pods up (never one of two), and waits again.
        queued = wait_for(
            lambda: (s := jobs.status("gang")).get("phase") == "Queued" and s.get("queue", {}).get("preemptions") and s,
            120,
            "the gang Preempted, then Queued",
        )
    preempted = next(c for c in queued["conditions"] if c["type"] == "Preempted")
    assert preempted["status"] == "True" and f"FineTuneJob {namespace}/urgent" in preempted["message"], preempted
    wait_for(lambda: not _live(jobs, "gang"), 60, "no pod of the gang left")
    assert jobs.wait_phase("urgent", "Succeeded", 120)["queue"]["admitted"] is True

    # Admitted again, as the same one Workload, both pods together, and done.
    seen: list[int] = []

    def finished() -> dict[str, Any] | None:
        seen.append(len(_live(jobs, "gang")))
        status = jobs.status("gang")
        return status if status.get("phase") == "Succeeded" else None

    final = wait_for(finished, 180, "the gang Succeeded after readmission", interval=0.5)
    assert 2 in seen, seen
    assert final["queue"]["preemptions"] == 1 and final["queue"]["admitted"] is True
    readmitted = next(c for c in final["conditions"] if c["type"] == "Preempted")
    assert readmitted["status"] == "False" and readmitted["reason"] == "Readmitted", readmitted
    assert len(_workloads_of(kueue_objects, namespace, job.metadata.uid)) == 1

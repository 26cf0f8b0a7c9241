"""A queued job's status from Kueue's Workload: the conditions below are what Kueue v0.17 wrote
on the local control plane (pending for quota, admitted, preempted, admitted again)."""

from finetune_operator import workloads
from finetune_operator.status.observation import Observation
from finetune_operator.status.phase import compute
from finetune_operator.status.queue import NO_WORKLOAD
from tests.support.bodies import NOW, job, pod

PREEMPTED = (
    "Preempted to accommodate a workload (UID: wl-high, JobUID: job-high) due to prioritization in the "
    "ClusterQueue; preemptor path: /pre; preemptee path: /pre"
)
SHORT = (
    "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor p40, 4 more needed"
)


def c(kind, status, reason, message="", at="2026-01-01T00:00:05Z"):
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": at}


def workload(*conditions, cluster_queue=None, owner_uid="job-uid"):
    status = {"conditions": list(conditions)}
    if cluster_queue:
        status["admission"] = {"clusterQueue": cluster_queue}
    return {
        "metadata": {
            "name": "job-a-1234",
            "namespace": "ns",
            "labels": {workloads.JOB_UID_LABEL: owner_uid},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "a", "uid": owner_uid}],
        },
        "status": status,
    }


PENDING = workload(c("QuotaReserved", "False", "Pending", SHORT))
ADMITTED = workload(
    c("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue gpus"),
    c("Admitted", "True", "Admitted", "The workload is admitted"),
    cluster_queue="gpus",
)
EVICTED = workload(
    c("QuotaReserved", "False", "Pending", SHORT),
    c("Evicted", "True", "Preempted", PREEMPTED),
    c("Admitted", "False", "NoReservation", "The workload has no reservation"),
    c("Preempted", "True", "InClusterQueue", PREEMPTED),
    c("Requeued", "True", "Preempted", PREEMPTED),
)
READMITTED = workload(
    c("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue gpus", at="2026-01-01T00:00:09Z"),
    c("Evicted", "False", "QuotaReserved", f"Previously: {PREEMPTED}"),
    c("Admitted", "True", "Admitted", "The workload is admitted", at="2026-01-01T00:00:09Z"),
    c("Preempted", "False", "QuotaReserved", f"Previously: {PREEMPTED}"),
    cluster_queue="gpus",
)


def observe(wl, *, current=None, suspend=True, pods=(), preemptor=None):
    admission = workloads.read(wl) if wl is not None else None
    return compute(
        Observation(
            generation=1,
            now=NOW,
            current=current or {},
            job=job(suspend=suspend),
            pods=pods,
            queued=True,
            queue_name="team",
            admission=admission,
            preemptor=preemptor,
        )
    )


def conds(outcome):
    return {x["type"]: x for x in outcome.status["conditions"]}


def test_the_workload_of_this_job_is_found_by_its_owner():
    assert workloads.of_job([PENDING], job()) is PENDING
    assert workloads.of_job([workload(owner_uid="older-job")], job()) is None
    assert workloads.owner_job_name(PENDING) == "a"
    assert workloads.preemptor_job_uid(PREEMPTED) == "job-high"


def test_waiting_for_quota_is_queued_in_kueues_words():
    out = observe(PENDING)
    assert out.phase == "Queued"
    assert out.status["message"] == SHORT
    assert out.status["queue"] == {
        "name": "team",
        "workload": "job-a-1234",
        "admitted": False,
        "reason": "Pending",
        "message": SHORT,
    }
    assert conds(out)["Admitted"]["status"] == "False" and conds(out)["Admitted"]["reason"] == "Pending"
    # Kueue's words are in the status (phase, message, queue, Admitted): no Event repeats them.
    assert out.transitions == []


def test_without_a_workload_the_job_waits_for_kueue():
    out = observe(None)
    assert out.phase == "Queued"
    assert out.status["queue"]["reason"] == NO_WORKLOAD


def test_admitted_then_running():
    admitted = observe(ADMITTED, suspend=False)
    assert admitted.phase == "Admitted"
    assert admitted.status["queue"]["clusterQueue"] == "gpus" and admitted.status["queue"]["admitted"] is True
    running = observe(ADMITTED, suspend=False, pods=[pod("a-x", "Running", node="gpu-1")], current=admitted.status)
    assert running.phase == "Running"
    assert conds(running)["Admitted"]["status"] == "True"


def test_preempted_while_the_pod_stops_then_queued_again_and_counted_once():
    running = observe(ADMITTED, suspend=False, pods=[pod("a-x", "Running", node="local-0")]).status
    stopping = observe(EVICTED, pods=[pod("a-x", "Running", node="local-0")], current=running, preemptor="ns/high")
    assert stopping.phase == "Preempted"
    assert stopping.status["queue"]["preemptions"] == 1
    assert stopping.status["queue"]["lastPreemption"]["by"] == "ns/high"
    assert conds(stopping)["Preempted"]["reason"] == "InClusterQueue"
    assert "FineTuneJob ns/high" in conds(stopping)["Preempted"]["message"]
    assert [(t.type, t.reason) for t in stopping.transitions] == [("Warning", "Preempted")]

    queued = observe(EVICTED, current=stopping.status, preemptor="ns/high")
    assert queued.phase == "Queued"
    assert queued.status["message"] == SHORT, "while it waits again, Kueue's reason for waiting is shown"
    assert queued.status["queue"]["preemptions"] == 1
    assert conds(queued)["Preempted"]["status"] == "True"
    assert queued.transitions == []  # queued again: the status says it, the preemption had its Warning

    again = observe(READMITTED, suspend=False, current=queued.status)
    assert again.phase == "Admitted"
    assert conds(again)["Preempted"]["status"] == "False" and conds(again)["Preempted"]["reason"] == "Readmitted"
    assert again.status["queue"]["preemptions"] == 1
    assert again.status["queue"]["lastPreemption"]["reason"] == "InClusterQueue"


def test_a_preemption_seen_only_after_the_pod_is_gone_still_gets_its_event():
    running = observe(ADMITTED, suspend=False, pods=[pod("a-x", "Running", node="local-0")]).status
    queued = observe(EVICTED, current=running)
    assert queued.phase == "Queued"
    assert [t.reason for t in queued.transitions] == ["Preempted"]
    assert queued.status["queue"]["preemptions"] == 1

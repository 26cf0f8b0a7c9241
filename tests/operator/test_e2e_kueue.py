"""End to end with the real Kueue (v0.17, hack/cluster/kueue.py) managing the operator's Jobs:
quota on fake P40 nodes (KWOK), and a high-priority job preempting the real trainer on local-0,
which resumes from its checkpoint when Kueue admits it again.

Each test makes its own ResourceFlavor, ClusterQueue (serving only the test's namespace) and
WorkloadPriorityClasses, named after the namespace, and deletes them afterwards.
"""

import copy
import datetime
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from finetune_cli.jobs import describe
from hack.cluster import binaries
from tests.fixtures.kueue import KueueObjects
from tests.support.harness import REPO, Jobs, OperatorProcess, wait_for
from tests.support.helm import render
from tests.support.specs import body, gpu_spec
from tests.support.training import (
    CHECKPOINTS,
    RUN_TIMEOUT,
    adapter_tensors,
    assert_same_trained_adapter,
    host_path,
    running_pod,
    summary,
    trainer_event,
    trainer_hooks,
    trainer_hooks_off,
    watch_until_done,
)

pytestmark = pytest.mark.cluster

QUEUE = "team"
# Every resource the operator's Jobs request must be covered by the ClusterQueue, or Kueue
# calls the workload inadmissible; only the one being tested is short.
PLENTY = {"cpu": "64", "memory": "256Gi", "ephemeral-storage": "1Ti"}


def cluster_queue(namespace: str, flavor: str, quota: dict[str, str], **spec: object) -> dict:
    return {
        "kind": "ClusterQueue",
        "metadata": {"name": namespace},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "resourceGroups": [
                {
                    "coveredResources": sorted(quota),
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [{"name": k, "nominalQuota": v} for k, v in sorted(quota.items())],
                        }
                    ],
                }
            ],
            **spec,
        },
    }


def local_queue(namespace: str, cq: str) -> dict:
    return {"kind": "LocalQueue", "metadata": {"name": QUEUE, "namespace": namespace}, "spec": {"clusterQueue": cq}}


def job_of(jobs: Jobs, name: str) -> client.V1Job | None:
    found = jobs.batch.list_namespaced_job(jobs.namespace, label_selector=f"finetune.dev/job={name}").items
    return found[0] if found else None


def kubectl_get_ftj(namespace: str, wide: bool = False) -> str:
    kubectl = binaries.resolve("kubectl")
    assert kubectl is not None
    argv = [str(kubectl), "get", "ftj", "-n", namespace] + (["-o", "wide"] if wide else [])
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=os.environ).stdout


def line_of(table: str, name: str) -> str:
    return next(line for line in table.splitlines() if line.split()[0] == name)


# --- what the chart and the example set up --------------------------------------------------------


def kueue_documents(namespace: str) -> list[dict]:
    """examples/kueue/queues.yaml and the chart's Kueue objects, their LocalQueues in `namespace`."""
    example = [d for d in yaml.safe_load_all((REPO / "examples" / "kueue" / "queues.yaml").read_text()) if d]
    chart = render(
        sets=["kueue.enabled=true", "kueue.localQueues[0].name=team", f"kueue.localQueues[0].namespace={namespace}"]
    )
    documents = example + [o for o in chart if o["apiVersion"].startswith("kueue.x-k8s.io/")]
    for doc in documents:
        if doc["kind"] == "LocalQueue":
            doc["metadata"]["namespace"] = namespace
    return documents


PLURALS = {
    "ResourceFlavor": "resourceflavors",
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "WorkloadPriorityClass": "workloadpriorityclasses",
}


def dry_run(custom: client.CustomObjectsApi, doc: dict) -> None:
    group, version = doc["apiVersion"].split("/")
    plural = PLURALS[doc["kind"]]
    namespace = doc["metadata"].get("namespace")
    if namespace:
        custom.create_namespaced_custom_object(group, version, namespace, plural, doc, dry_run="All")
    else:
        custom.create_cluster_custom_object(group, version, plural, doc, dry_run="All")


def test_the_example_and_the_charts_kueue_objects_pass_kueues_own_admission(
    namespace: str, kueue_objects: KueueObjects, kube: client.ApiClient
) -> None:
    """Kueue's CRD schemas, CEL rules and webhooks accept them (a server-side dry run)."""
    custom = client.CustomObjectsApi(kube)
    documents = kueue_documents(namespace)
    assert {d["kind"] for d in documents} == {"ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"}
    for doc in documents:
        dry_run(custom, doc)
    # The check can fail: a flavor that leaves out a covered resource is refused.
    broken = copy.deepcopy(next(d for d in documents if d["kind"] == "ClusterQueue"))
    broken["spec"]["resourceGroups"][0]["flavors"][0]["resources"].pop()
    with pytest.raises(ApiException) as refused:
        dry_run(custom, broken)
    assert refused.value.status == 422


def p40_flavor(kueue_objects: KueueObjects, namespace: str) -> str:
    """The test's ResourceFlavor of the KWOK P40 nodes; returns its name."""
    flavor = f"{namespace}-p40"
    kueue_objects.create(
        {
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
            "spec": {"nodeLabels": {"nvidia.com/gpu.product": "Tesla-P40"}},
        }
    )
    return flavor


# --- quota --------------------------------------------------------------------------------------


def test_a_job_beyond_the_gpu_quota_queues_with_kueues_reason_until_the_first_ends(
    namespace: str, jobs: Jobs, kueue_objects: KueueObjects, operator: OperatorProcess
) -> None:
    flavor = p40_flavor(kueue_objects, namespace)
    kueue_objects.create(cluster_queue(namespace, flavor, {**PLENTY, "nvidia.com/gpu": "4"}))
    spec = gpu_spec(gpus=4, placement={"queueName": QUEUE})

    # No LocalQueue yet: Kueue holds the first job's Workload, so the test can make its pod
    # stay Running on KWOK (the annotation may change while a Job has never started).
    jobs.create("first", spec)
    status = jobs.wait_phase("first", "Queued", 60)
    wait_for(lambda: jobs.status("first").get("queue", {}).get("workload"), 60, "Kueue's Workload of first")
    assert "doesn't exist" in jobs.status("first")["message"], jobs.status("first")
    assert status["queue"]["name"] == QUEUE
    template = {"spec": {"template": {"metadata": {"annotations": {"kwok.finetune.dev/run-ms": "20s"}}}}}
    jobs.batch.patch_namespaced_job("first", namespace, template)
    # Kueue admits equal priorities oldest first, by creationTimestamp, in whole seconds: the
    # second job's Workload must be born in a later second than the first's.
    (workload,) = kueue_objects.list("workloads", namespace)
    born = datetime.datetime.fromisoformat(workload["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    wait_for(lambda: datetime.datetime.now(datetime.UTC) >= born + datetime.timedelta(seconds=1.1), 5, "a new second")
    jobs.create("second", spec)
    wait_for(lambda: jobs.status("second").get("queue", {}).get("workload"), 60, "Kueue's Workload of second")

    kueue_objects.create(local_queue(namespace, namespace))
    running = jobs.wait_phase("first", "Running", 60)
    assert running["queue"]["admitted"] is True and running["queue"]["clusterQueue"] == namespace
    assert {c["type"]: c["status"] for c in running["conditions"]}["Admitted"] == "True"

    queued = wait_for(
        lambda: (s := jobs.status("second")).get("phase") == "Queued" and "quota" in s.get("message", "") and s,
        60,
        "second Queued for quota",
    )
    assert queued["queue"]["admitted"] is False
    assert queued["queue"]["reason"] == "Pending", queued["queue"]
    assert "insufficient unused quota for nvidia.com/gpu" in queued["message"]
    admitted = next(c for c in queued["conditions"] if c["type"] == "Admitted")
    assert admitted["status"] == "False" and "insufficient unused quota" in admitted["message"]
    assert not jobs.pods("second"), "a queued job has no pod"

    assert f"Queue:       {QUEUE}, waiting: Pending" in describe(jobs.get("second") or {})

    table = kubectl_get_ftj(namespace)
    assert "Queued" in line_of(table, "second") and "insufficient unused quota" in line_of(table, "second")
    assert "Running" in line_of(table, "first")
    wide = kubectl_get_ftj(namespace, wide=True)
    assert QUEUE in line_of(wide, "second") and "Pending" in line_of(wide, "second")

    jobs.wait_phase("first", "Succeeded", 60)
    final = jobs.wait_phase("second", "Succeeded", 60)
    assert final["queue"]["admitted"] is True
    # Queued, Admitted and Succeeded are in the status (the Admitted condition keeps when):
    # no Event repeats them.
    assert jobs.operator_events("second") == []


# --- priority and preemption with the real trainer ------------------------------------------------

# Long enough to be preempted between checkpoints, short enough for the suite: a tiny step takes
# about 0.1 s on the CPU (more on a busy machine).
LOW_TRAINING = {"maxSteps": 160, "batchSize": 2, "gradientAccumulation": 1, "maxLength": 64, "learningRate": 3e-3}
HIGH_TRAINING = {**LOW_TRAINING, "maxSteps": 16}


def final_adapter(folders: dict[str, Path], status: dict) -> Path:
    """The host folder of a finished job's adapter: for comparing a preempted run's adapter with an
    uninterrupted run's (the trainer's checkpoint on SIGTERM makes them equal)."""
    return host_path(folders, status["output"]["adapterPath"])


@pytest.mark.trainer
def test_a_high_priority_job_preempts_the_trainer_which_resumes_from_its_checkpoint(
    cluster,
    core: client.CoreV1Api,
    namespace: str,
    jobs: Jobs,
    kueue_objects: KueueObjects,
    training_volumes: dict[str, Path],
    operator: OperatorProcess,
) -> None:
    flavor = f"{namespace}-cpu"
    kueue_objects.create({"kind": "ResourceFlavor", "metadata": {"name": flavor}})
    # One trainer at a time (each asks for 1 CPU); a higher priority preempts a lower one.
    quota = {**PLENTY, "cpu": "1"}
    kueue_objects.create(cluster_queue(namespace, flavor, quota, preemption={"withinClusterQueue": "LowerPriority"}))
    for name, value in (("low", 100), ("high", 1000)):
        kueue_objects.create(
            {"kind": "WorkloadPriorityClass", "metadata": {"name": f"{namespace}-{name}"}, "value": value}
        )
    kueue_objects.create(local_queue(namespace, namespace))

    def placed(priority: str) -> dict:
        return {"queueName": QUEUE, "workloadPriorityClassName": f"{namespace}-{priority}"}

    # 0.25 s per step: the 160 steps take over 40 s, so the preemption's way through Kueue, the
    # operator and the Job controller reaches a running trainer on a loaded machine too (with
    # four test workers on two cores the run once ended before its SIGTERM came).
    trainer_hooks(core, namespace, "low", FINETUNE_TEST_STEP_DELAY="0.25")
    jobs.create("low", body(training=LOW_TRAINING, checkpoints=CHECKPOINTS, placement=placed("low")))
    # The same spec outside any queue, never preempted: the adapter the preempted one must end with.
    jobs.create("steady", body(training=LOW_TRAINING, checkpoints=CHECKPOINTS))
    checkpoint = wait_for(
        lambda: (s := jobs.status("low")).get("phase") == "Running" and s.get("lastCheckpoint", {}).get("step") and s,
        RUN_TIMEOUT,
        "low's first checkpoint",
    )["lastCheckpoint"]
    assert jobs.status("low")["queue"]["admitted"] is True
    low_pod = running_pod(jobs, "low")
    assert low_pod is not None

    jobs.create("high", body(training=HIGH_TRAINING, checkpoints=CHECKPOINTS, placement=placed("high")))
    phases: list[str] = []

    def preempted_then_queued() -> dict | None:
        status = jobs.status("low")
        if status.get("phase") and (not phases or phases[-1] != status["phase"]):
            phases.append(status["phase"])
        return status if status.get("phase") == "Queued" and status.get("queue", {}).get("preemptions") else None

    queued = wait_for(preempted_then_queued, 120, "low Preempted, then Queued", interval=0.2)
    preempted = next(c for c in queued["conditions"] if c["type"] == "Preempted")
    assert preempted["status"] == "True" and preempted["reason"] == "InClusterQueue", preempted
    assert f"FineTuneJob {namespace}/high" in preempted["message"]
    assert queued["queue"]["lastPreemption"]["by"] == f"{namespace}/high"
    assert queued["queue"]["preemptions"] == 1
    assert queued["queue"]["admitted"] is False
    assert phases[-1] == "Queued" and "Succeeded" not in phases, phases
    low_events = jobs.events_with("low", "Preempted")
    preemption_events = [e for e in low_events if e["reason"] == "Preempted" and e["type"] == "Warning"]
    assert len(preemption_events) == 1 and f"{namespace}/high" in preemption_events[0]["message"], preemption_events
    assert not [p for p in jobs.pods("low") if p["status"].get("phase") in ("Pending", "Running")]
    # On SIGTERM the trainer wrote a checkpoint of the point it had reached. (Its micro-batch and
    # the checkpoint took over 30 s once on a 2-core machine running a load soak beside the suite.)
    stop = wait_for(lambda: trainer_event(cluster, namespace, low_pod["metadata"]["name"], "stopped"), 90, "low's stop")
    # Stopped where it was: low's next attempt (after high) finishes the run at full speed.
    trainer_hooks_off(core, namespace, "low")

    high = watch_until_done(jobs, "high")[2]
    assert high["phase"] == "Succeeded", high
    # high ran while low waited. Its Running phase is no evidence: a 16-step run can end inside
    # the operator's coalescing window, so the status may go from Admitted to Succeeded in one
    # write (CI saw ['Succeeded'] once). What it trained and when its Job started are.
    assert high["queue"]["admitted"] is True and high.get("startTime"), high
    assert summary(training_volumes, "high")["finalStep"] == HIGH_TRAINING["maxSteps"]

    later_phases, _, final = watch_until_done(jobs, "low")
    assert final["phase"] == "Succeeded", final
    assert "Running" in later_phases
    resumed = summary(training_volumes, "low")["resumedFrom"]
    assert resumed is not None and resumed["step"] >= checkpoint["step"] > 0, resumed
    assert Path(resumed["path"]).name == stop["checkpoint"], (resumed, stop)  # nothing trained twice
    assert summary(training_volumes, "low")["finalStep"] == LOW_TRAINING["maxSteps"]
    readmitted = next(c for c in final["conditions"] if c["type"] == "Preempted")
    assert readmitted["status"] == "False" and readmitted["reason"] == "Readmitted"
    assert final["queue"]["preemptions"] == 1
    assert f"preempted 1x, last by {namespace}/high" in describe(jobs.get("low") or {})
    assert (final_adapter(training_volumes, final) / "adapter_config.json").is_file()
    steady = watch_until_done(jobs, "steady")[2]
    assert steady["phase"] == "Succeeded", steady
    assert_same_trained_adapter(adapter_tensors(training_volumes, final), adapter_tensors(training_volumes, steady))

"""Jobs of two nodes through the real operator, on the control plane and the node agent's two
nodes: the operator makes the headless Service and the Indexed Job, the pods find each other by
the Service's names, meet at the rendezvous on pod 0 and train the adapter of one pod with two
processes; a killed rank restarts the whole gang from the last complete checkpoint; a gang that
cannot be placed says so and trains nothing; all of it goes with the FineTuneJob.

One gang at a time: the agent's pods share the host's network namespace, and each gang's pod 0
listens on the rendezvous port (29400).
"""

import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from finetune_api.multinode import COMPLETION_INDEX_ANNOTATION
from tests.support.cli import assert_one_line_error
from tests.support.cli import ftjob_process as ftjob
from tests.support.harness import Jobs, OperatorProcess, wait_for
from tests.support.processes import trainer_pid, worker_pid
from tests.support.specs import body
from tests.support.training import (
    adapter_tensors,
    assert_same_trained_adapter,
    max_difference,
    summary,
    watch_until_done,
)

pytestmark = [pytest.mark.cluster, pytest.mark.trainer]

# Long enough that a kill after the first checkpoint lands mid-run (a tiny step takes about
# 0.1 s per rank, more beside another job), short enough for 2 busy cores.
TRAINING = {"maxSteps": 40, "batchSize": 2, "gradientAccumulation": 1, "maxLength": 64, "learningRate": 3e-3}
CHECKPOINTS = {"everySteps": 8, "keep": 2}
GANG = {"gpus": 0, "cpu": "1", "memory": "2Gi", "processes": 1, "nodes": 2}
ONE_POD = {"gpus": 0, "cpu": "2", "memory": "4Gi", "processes": 2}
# The agent's second node takes only pods that tolerate its taint.
LOCAL_NODES = [{"key": "finetune.dev/local-node", "operator": "Exists", "effect": "NoSchedule"}]
COMPLETE = "CHECKPOINT_COMPLETE.json"


def apart(name: str, required: bool = False) -> dict[str, Any]:
    """One pod per node: preferred (a replacement is never kept off a node), or required."""
    term = {"labelSelector": {"matchLabels": {"finetune.dev/job": name}}, "topologyKey": "kubernetes.io/hostname"}
    rule = (
        {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
        if required
        else {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]}
    )
    return {"podAntiAffinity": rule}


def gang_spec(name: str, **extra: Any) -> dict[str, Any]:
    placement = {"tolerations": LOCAL_NODES, "affinity": apart(name)}
    return body(training=TRAINING, checkpoints=CHECKPOINTS, resources=GANG, placement=placement, **extra)


def index_of(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["annotations"][COMPLETION_INDEX_ANNOTATION])


def running_pod_of_index(jobs: Jobs, name: str, index: int) -> dict[str, Any] | None:
    return next(
        (p for p in jobs.pods(name) if index_of(p) == index and p["status"].get("phase") == "Running"),
        None,
    )


def newest_checkpoint(outputs: Path, name: str) -> int | None:
    steps = [int(m.parent.name.split("-")[1]) for m in (outputs / name).rglob(f"checkpoint-*/{COMPLETE}")]
    return max(steps) if steps else None


def gone(read: Any) -> bool:
    try:
        read()
    except ApiException as exc:
        return exc.status == 404
    return False


# Serial (tests/run.py): it asserts exactly one gang restart after the kill, and beside three
# other workers on two cores the gang once restarted twice (the job still Succeeded).
@pytest.mark.serial
def test_two_nodes_train_the_adapter_of_one_pod_of_two_and_a_killed_rank_restarts_the_whole_gang(
    cluster: Any,
    namespace: str,
    core: client.CoreV1Api,
    batch: client.BatchV1Api,
    jobs: Jobs,
    training_volumes: dict[str, Path],
    operator: OperatorProcess,
) -> None:
    outputs = training_volumes["outputs"]
    # The reference (one pod, two processes) beside a gang whose rank 1 is killed mid-run.
    jobs.create("one-pod", body(training=TRAINING, checkpoints=CHECKPOINTS, resources=ONE_POD))
    jobs.create("killed", gang_spec("killed", backoffLimit=2))

    killed_after = wait_for(lambda: newest_checkpoint(outputs, "killed"), 300, "the gang's first checkpoint", 0.1)
    pod = wait_for(lambda: running_pod_of_index(jobs, "killed", 1), 30, "the pod of index 1")
    launcher = trainer_pid(cluster, namespace, pod["metadata"]["name"])
    os.kill(wait_for(lambda: worker_pid(launcher, 1), 30, "rank 1's process", 0.1), signal.SIGKILL)

    reference = watch_until_done(jobs, "one-pod")[2]
    assert reference["phase"] == "Succeeded", reference
    phases, _, status = watch_until_done(jobs, "killed")
    assert status["phase"] == "Succeeded", status
    assert "Failed" not in phases, f"a killed rank is retryable: {phases}"
    # Both pods of the first attempt ended (rank 1 killed, rank 0's collective broke with it),
    # and both were replaced: one gang attempt, one restart.
    failed = sorted(index_of(p) for p in jobs.pods("killed") if p["status"]["phase"] == "Failed")
    assert failed == [0, 1], failed
    assert status["restarts"] == 1
    assert jobs.events_with("killed", "Restarted")
    resumed = summary(training_volumes, "killed")["resumedFrom"]
    assert resumed is not None and resumed["step"] >= killed_after, (resumed, killed_after)
    expected = adapter_tensors(training_volumes, reference)
    difference = max_difference(adapter_tensors(training_volumes, status), expected)
    print(f"gang restarted after rank 1 was killed, against one pod of two: max abs difference {difference}")
    assert_same_trained_adapter(adapter_tensors(training_volumes, status), expected)

    # An uninterrupted gang: the same adapter too.
    jobs.create("pair", gang_spec("pair"))
    status = watch_until_done(jobs, "pair")[2]
    assert status["phase"] == "Succeeded", status
    assert status["restarts"] == 0 and status["nodes"]["total"] == 2
    done = summary(training_volumes, "pair")
    assert (done["worldSize"], done["finalStep"], done["ranksInStep"]) == (2, TRAINING["maxSteps"], True)
    pods = jobs.pods("pair")
    assert sorted(index_of(p) for p in pods) == [0, 1]
    assert len({p["status"]["podIP"] for p in pods}) == 2
    difference = max_difference(adapter_tensors(training_volumes, status), expected)
    print(f"two nodes of one process against one pod of two: max abs difference {difference}")
    assert_same_trained_adapter(adapter_tensors(training_volumes, status), expected)

    # `ftjob logs --rank N` reads the pod of each node rank; a rank the job has not is one line.
    where = ["-n", namespace, "--logs-dir", str(cluster.layout.pods)]
    for rank in (0, 1):
        logs = ftjob("logs", "pair", "--rank", str(rank), *where)
        assert logs.returncode == 0, logs.stderr
        assert f"node {rank} of 2: rendezvous at" in logs.stdout, logs.stdout[-2000:]
    assert_one_line_error(ftjob("logs", "pair", "--rank", "2", *where), "--rank 2", "node ranks 0 to 1")

    service = core.read_namespaced_service("pair", namespace)
    assert service.spec.cluster_ip == "None" and service.metadata.owner_references[0].kind == "FineTuneJob"
    assert batch.read_namespaced_job("pair", namespace).spec.completion_mode == "Indexed"
    jobs.delete("pair")
    wait_for(lambda: gone(lambda: core.read_namespaced_service("pair", namespace)), 60, "the Service to be collected")
    wait_for(lambda: gone(lambda: batch.read_namespaced_job("pair", namespace)), 60, "the Job to be collected")
    wait_for(lambda: not jobs.pods("pair"), 90, "the pods to be collected")


def test_a_gang_with_a_pod_that_cannot_be_placed_says_so_within_seconds_and_trains_nothing(
    cluster: Any,
    namespace: str,
    jobs: Jobs,
    training_volumes: dict[str, Path],
    operator: OperatorProcess,
) -> None:
    # Pod 1 may not share local-0 with pod 0, and does not tolerate local-1's taint.
    placement = {"affinity": apart("lonely", required=True)}
    spec = body(training=TRAINING, checkpoints=CHECKPOINTS, resources=GANG, placement=placement)
    spec["activeDeadlineSeconds"] = 45
    started = time.monotonic()
    jobs.create("lonely", spec)

    def unschedulable() -> dict[str, Any] | None:
        status = jobs.status("lonely")
        return status if (status.get("message") or "").startswith("Unschedulable: 1 of 2 pods pending: ") else None

    status = wait_for(unschedulable, 120, "the gang's missing pod in status", 0.2)
    seen = datetime.now(UTC)
    elapsed = time.monotonic() - started
    print(f"Unschedulable in status {elapsed:.1f} s after the FineTuneJob was created: {status['message']}")
    # Within seconds of the event it reports: the scheduler marking the pod unschedulable. The
    # ceiling is generous (the operator sees pods on its own stream, well under a second here).
    marked = [
        datetime.fromisoformat(c["lastTransitionTime"].replace("Z", "+00:00"))
        for p in jobs.pods("lonely")
        for c in p["status"].get("conditions") or []
        if c["type"] == "PodScheduled" and c["status"] == "False"
    ]
    assert marked, "no pod marked unschedulable, yet the status says so"
    lag = (seen - max(marked)).total_seconds()
    print(f"status {lag:.1f} s after the scheduler marked the pod unschedulable")
    assert lag <= 20, lag
    assert "didn't match pod anti-affinity" in status["message"], status["message"]
    assert status["phase"] == "Pending"

    # Pod 0 runs its launcher, which waits at the rendezvous: no trainer process, no progress.
    pod = wait_for(lambda: running_pod_of_index(jobs, "lonely", 0), 60, "pod 0 to run")
    launcher = trainer_pid(cluster, namespace, pod["metadata"]["name"])
    wait_for(lambda: jobs.status("lonely").get("nodes") == {"ready": 1, "total": 2}, 30, "nodes 1 of 2")
    for _ in range(6):
        assert worker_pid(launcher, 0) is None, "a trainer started without its whole gang"
        time.sleep(0.5)
    status = jobs.status("lonely")
    assert status["phase"] == "Pending" and "progress" not in status, status
    running = jobs.condition("lonely", "Running")
    assert running["status"] == "False", running

    # activeDeadlineSeconds applies: the gang does not hold its node forever.
    status = jobs.wait_phase("lonely", "Failed", 120)
    failed = jobs.condition("lonely", "Failed")
    assert failed["reason"] == "DeadlineExceeded", failed
    wait_for(lambda: not any(p["status"]["phase"] in ("Pending", "Running") for p in jobs.pods("lonely")), 60, "pods")

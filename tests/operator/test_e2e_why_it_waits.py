"""Why a job waits, on the local control plane: a job no P40 node can hold is warned within 30 s
(the largest node's GPUs and the fix) and `ftjob watch` exits 3 saying it; a job that only waits
for GPUs in use says the scheduler's words within 30 s and is not warned; a ResourceQuota that
refuses its pod is said in its own words; `ftjob plan` against the cluster refuses what no node
holds with a nodes x GPUs split that would. The operator runs as a subprocess under the chart's RBAC."""

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hack.cluster.nodes import GpuProduct, gpu_node
from tests.support.cli import REPO, ftjob_process
from tests.support.harness import Jobs, OperatorProcess, wait_for
from tests.support.specs import gpu_job, gpu_spec

pytestmark = pytest.mark.cluster

# "Within seconds": what a user waits for at most before the status says why.
SAYS_WHY_S = 30


def condition_false(jobs: Jobs, name: str, kind: str) -> dict[str, Any] | None:
    found = jobs.condition(name, kind)
    return found if found.get("status") == "False" else None


def test_a_job_no_p40_node_can_hold_is_warned_within_30_s_and_watch_exits_3(
    namespace: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create("huge", gpu_spec(gpus=16))
    started = time.monotonic()
    said = wait_for(lambda: condition_false(jobs, "huge", "Schedulable"), SAYS_WHY_S, "Schedulable=False on huge")
    took = time.monotonic() - started
    print(f"warned {took:.1f} s after the create")
    assert said["reason"] == "TooManyGpusPerNode"
    # the count of nodes is the cluster's at that moment: tests beside this one join nodes of their own
    largest = re.match(r"16 GPUs per pod: no Tesla-P40 node has more than 4 \((\d+) nodes of 4 GPUs", said["message"])
    assert largest and int(largest.group(1)) >= 4, said["message"]
    assert "resources.nodes: 4 with gpus: 4 (the same 16 GPUs)" in said["message"]
    status = jobs.status("huge")
    assert status["phase"] == "Pending" and status["message"] == f"TooManyGpusPerNode: {said['message']}"
    warned = jobs.events_with("huge", "TooManyGpusPerNode")
    assert [e["type"] for e in warned if e["reason"] == "TooManyGpusPerNode"] == ["Warning"]
    watched = ftjob_process("watch", "huge", "-n", namespace, "--timeout", "60")
    assert watched.returncode == 3, (watched.stdout, watched.stderr)
    assert "huge cannot run here: TooManyGpusPerNode: 16 GPUs per pod: no Tesla-P40 node" in watched.stderr
    assert "resources.nodes: 4 with gpus: 4" in watched.stdout  # the waiting line says it too
    assert "Traceback" not in watched.stderr
    shown = ftjob_process("status", "huge", "-n", namespace)
    assert shown.returncode == 0, shown.stderr
    assert f"Message:     TooManyGpusPerNode: {said['message']}" in shown.stdout
    assert "Schedulable" in shown.stdout and "TooManyGpusPerNode" in shown.stdout


@pytest.fixture
def busy_node(core: client.CoreV1Api, batch: client.BatchV1Api, namespace: str) -> Iterator[str]:
    """A KWOK node of a product of its own with one GPU, held by a pod that runs for minutes: the
    next pod of that product waits for a GPU in use, away from every other test's nodes."""
    product = f"Test-GPU-{uuid.uuid4().hex[:6]}"
    node = gpu_node(f"gpu-busy-{product[-6:]}", GpuProduct(product, "pascal", 24576, 6, 1), 1)
    core.create_node(node)
    name = node["metadata"]["name"]

    def ready() -> bool:
        found = core.read_node(name)
        return any(c.type == "Ready" and c.status == "True" for c in found.status.conditions or [])

    wait_for(ready, 60, f"node {name} Ready")
    batch.create_namespaced_job(namespace, gpu_job("holder", 1, product, {"kwok.finetune.dev/run-ms": "600s"}))

    def holding() -> bool:
        pods = core.list_namespaced_pod(namespace, label_selector="job-name=holder").items
        return any(p.spec.node_name == name for p in pods)

    wait_for(holding, 60, f"the holder's pod on {name}")
    yield product
    try:
        core.delete_node(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


# Serial: it adds a Node, cluster-wide, which tests that read every node (tests/cluster) would meet.
@pytest.mark.serial
def test_a_job_waiting_for_gpus_in_use_says_the_schedulers_words_within_30_s(
    busy_node: str, namespace: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create("waits", gpu_spec(gpus=1, product=busy_node))
    said = wait_for(lambda: condition_false(jobs, "waits", "Scheduled"), SAYS_WHY_S, "Scheduled=False on waits")
    assert "Insufficient nvidia.com/gpu" in said["message"], said
    status = jobs.status("waits")
    assert status["phase"] == "Pending" and status["message"] == said["message"]
    shown = ftjob_process("status", "waits", "-n", namespace)
    assert f"Message:     {' '.join(said['message'].split())}" in shown.stdout, shown.stdout
    # A node of its product holds it once the GPU is free: no warning, no Event of the operator.
    assert "Schedulable" not in {c["type"] for c in status["conditions"]}
    assert jobs.operator_events("waits") == []


def test_a_quota_that_refuses_the_pod_is_said_in_its_words_within_30_s(
    core: client.CoreV1Api, namespace: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    quota = {"metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "2"}}}
    core.create_namespaced_resource_quota(namespace, quota)
    wait_for(lambda: core.read_namespaced_resource_quota("gpus", namespace).status.hard, 30, "the quota's status")
    jobs.create("quota", gpu_spec(gpus=4))
    said = wait_for(lambda: condition_false(jobs, "quota", "Scheduled"), SAYS_WHY_S, "Scheduled=False on quota")
    assert said["reason"] == "FailedCreate"
    assert said["message"].startswith("the Job cannot create its pod: ")
    assert "exceeded quota: gpus" in said["message"] and "requests.nvidia.com/gpu" in said["message"]
    assert jobs.status("quota")["message"] == said["message"]


def test_ftjob_plan_against_the_cluster_refuses_sixteen_gpus_with_a_nodes_x_gpus_split(
    cluster: Any, tmp_path: Any
) -> None:
    """Read from the cluster's nodes (KUBECONFIG, as the fixture sets it), not the planner's server."""
    job = yaml.safe_load((REPO / "examples" / "llama-3.3-70b-4xp40.yaml").read_text())
    job["spec"]["resources"]["gpus"] = 16
    manifest = tmp_path / "sixteen.yaml"
    manifest.write_text(yaml.safe_dump(job))
    result = ftjob_process("plan", str(manifest))
    assert result.returncode == 3, (result.stdout, result.stderr)
    lines = result.stdout.splitlines()
    assert lines[1].startswith("DOES NOT FIT: 16 GPUs per pod: no Tesla-P40 node has more than 4 (4 nodes of 4 GPUs")
    assert "resources.nodes: 4 with gpus: 4 (the same 16 GPUs)" in lines[1]
    assert any(x == "nodes     the verdict above is against the cluster's nodes" for x in lines), lines[:5]

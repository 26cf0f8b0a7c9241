"""The platform's guardrails end to end, on fake GPU nodes (KWOK): a job above the limits fails
before any child, the default deadline lands on the Job, and a job whose pods no node can take
fails Unschedulable after the pending timeout, naming the label, the value and what the nodes
carry. The operator runs under the chart's RBAC (files/operator-rbac.yaml)."""

from collections import Counter
from collections.abc import Callable

import pytest
from kubernetes import client

from tests.support.harness import Jobs, OperatorProcess, wait_for
from tests.support.specs import gpu_spec

pytestmark = pytest.mark.cluster

LABEL = "nvidia.com/gpu.product"
GUARDRAILS = {
    "FINETUNE_MAX_GPUS_PER_JOB": "4",
    "FINETUNE_DEFAULT_ACTIVE_DEADLINE_SECONDS": "86400",
    "FINETUNE_PENDING_TIMEOUT_SECONDS": "3",
}


@pytest.fixture
def guarded(start_operator: Callable[..., OperatorProcess]) -> OperatorProcess:
    return start_operator(env=GUARDRAILS)


def test_a_job_above_the_gpu_limit_fails_before_any_child(jobs: Jobs, guarded: OperatorProcess) -> None:
    jobs.create("greedy", gpu_spec(gpus=8))
    status = jobs.wait_phase("greedy", "Failed", 60)
    assert status["message"] == "spec.resources.gpus: 8 GPU(s) is above this cluster's limit of 4 GPU(s) per job"
    assert jobs.condition("greedy", "Failed")["reason"] == "ExceedsLimit"
    assert jobs.batch.list_namespaced_job(jobs.namespace).items == []


def test_a_product_no_node_has_fails_unschedulable_naming_what_the_nodes_carry(
    jobs: Jobs, guarded: OperatorProcess
) -> None:
    jobs.create("h100", gpu_spec(gpus=2, product="NVIDIA-H100-80GB-HBM3", precision="bf16"))
    status = jobs.wait_phase("h100", "Failed", 90)
    nodes = client.CoreV1Api(jobs.api).list_node(label_selector=LABEL).items
    have = Counter(n.metadata.labels[LABEL] for n in nodes)
    listed = ", ".join(f"{v} x {c}" for v, c in sorted(have.items(), key=lambda i: (-i[1], i[0])))
    said = f"pods unschedulable for over 3 s: no node has {LABEL}=NVIDIA-H100-80GB-HBM3 (nodes have: {listed})"
    assert status["message"] == said
    assert "Tesla-P40 x " in said
    assert jobs.condition("h100", "Failed")["reason"] == "Unschedulable"
    # Its Job is suspended, so its pods are gone and none is placed later; the default deadline
    # stands on it, the spec having set none.
    job = jobs.batch.read_namespaced_job("h100", jobs.namespace)
    assert job.spec.suspend is True and job.spec.active_deadline_seconds == 86400
    wait_for(lambda: not jobs.pods("h100") or None, 60, "the h100 pods gone")
    assert jobs.events_with("h100", "Unschedulable")
    assert jobs.status("h100")["phase"] == "Failed"

"""Fake GPU nodes: the real scheduler places GPU Jobs by product, count and taint; KWOK runs them."""

from typing import Any

import pytest
from kubernetes import client

from hack.cluster.nodes import GPU_RESOURCE
from tests.fixtures.cluster import pod_of_job, pods_of_job, wait_for, wait_job_condition, wait_pod_phase
from tests.support.specs import gpu_job

pytestmark = pytest.mark.cluster


def test_nodes_look_like_gfd_labelled_gpu_pools(core: client.CoreV1Api) -> None:
    nodes = {n.metadata.name: n for n in core.list_node().items}
    p40 = [n for n in nodes.values() if n.metadata.labels.get("nvidia.com/gpu.product") == "Tesla-P40"]
    assert len(p40) == 4
    for node in p40:
        assert node.status.allocatable[GPU_RESOURCE] == "4"
        assert node.metadata.labels["nvidia.com/gpu.count"] == "4"
        assert any(t.key == GPU_RESOURCE and t.effect == "NoSchedule" for t in node.spec.taints)
    assert any("A100" in n.metadata.labels.get("nvidia.com/gpu.product", "") for n in nodes.values())
    local = nodes["local-0"]
    assert not local.spec.taints and GPU_RESOURCE not in local.status.allocatable
    for node in nodes.values():
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)


def test_two_gpu_p40_job_lands_on_a_p40_node_and_succeeds(
    core: client.CoreV1Api, batch: client.BatchV1Api, namespace: str
) -> None:
    batch.create_namespaced_job(namespace, gpu_job("p40", 2))
    wait_job_condition(batch, namespace, "p40", "Complete")
    pod = pod_of_job(core, namespace, "p40")
    assert pod.spec.node_name.startswith("gpu-p40-")
    assert pod.status.phase == "Succeeded"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0


def test_a100_selector_lands_on_the_a100_node(core: client.CoreV1Api, batch: client.BatchV1Api, namespace: str) -> None:
    batch.create_namespaced_job(namespace, gpu_job("a100", 1, product="NVIDIA-A100-SXM4-80GB"))
    pod = wait_pod_phase(core, namespace, pod_of_job(core, namespace, "a100").metadata.name, {"Running", "Succeeded"})
    assert pod.spec.node_name.startswith("gpu-a100-")


def test_five_gpus_stay_pending_unschedulable(core: client.CoreV1Api, batch: client.BatchV1Api, namespace: str) -> None:
    batch.create_namespaced_job(namespace, gpu_job("too-big", 5))

    def unschedulable() -> Any:
        pods = pods_of_job(core, namespace, "too-big")
        for condition in (pods[0].status.conditions or []) if pods else []:
            if condition.type == "PodScheduled" and condition.status == "False" and condition.reason == "Unschedulable":
                return pods[0], condition
        return None

    pod, condition = wait_for(unschedulable, 30, "an Unschedulable condition")
    assert pod.status.phase == "Pending" and not pod.spec.node_name
    assert "nvidia.com/gpu" in condition.message


def test_deleting_the_job_garbage_collects_its_pod(
    core: client.CoreV1Api, batch: client.BatchV1Api, namespace: str
) -> None:
    batch.create_namespaced_job(namespace, gpu_job("gc", 1, annotations={"kwok.finetune.dev/run-ms": "600s"}))
    pod = wait_pod_phase(core, namespace, pod_of_job(core, namespace, "gc").metadata.name, {"Running"})
    batch.delete_namespaced_job("gc", namespace, propagation_policy="Background")
    wait_for(lambda: not pods_of_job(core, namespace, "gc"), 60, f"pod {pod.metadata.name} to be collected")


@pytest.mark.parametrize(
    ("annotations", "exit_code", "reason"),
    [
        ({"kwok.finetune.dev/exit-code": "137", "kwok.finetune.dev/reason": "OOMKilled"}, 137, "OOMKilled"),
        ({"kwok.finetune.dev/exit-code": "13", "kwok.finetune.dev/message": "WontFit: 70B on 1 GPU"}, 13, "Error"),
    ],
)
def test_annotations_make_a_kwok_pod_fail(
    core: client.CoreV1Api,
    batch: client.BatchV1Api,
    namespace: str,
    annotations: dict[str, str],
    exit_code: int,
    reason: str,
) -> None:
    batch.create_namespaced_job(namespace, gpu_job("fails", 1, annotations=annotations))
    pod = wait_pod_phase(core, namespace, pod_of_job(core, namespace, "fails").metadata.name, {"Failed", "Succeeded"})
    assert pod.status.phase == "Failed"
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (exit_code, reason)
    if "kwok.finetune.dev/message" in annotations:
        assert terminated.message == annotations["kwok.finetune.dev/message"]
    wait_job_condition(batch, namespace, "fails", "Failed")

"""The children of a job of two nodes, as the builders make them, on the real control plane and
the node agent's two nodes: the Indexed Job's pods find each other through the headless Service's
names, meet at the rendezvous on pod 0 and train one adapter; all of it goes with the FineTuneJob.

The builders are not wired into the operator's reconcile yet: this test applies what they build,
with no operator running, so it proves the pieces (API, builders, launcher, agent) fit together.
"""

import json
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from finetune_api.spec import FineTuneJobSpec
from finetune_operator.builders import rbac
from finetune_operator.builders.multinode import indexed_job, service
from finetune_operator.children import Owner
from finetune_operator.settings import Settings
from tests.fixtures.cluster import wait_job_condition

from .harness import Jobs, wait_for
from .specs import body

pytestmark = [pytest.mark.cluster, pytest.mark.trainer]

NAME = "pair"
TWO_NODES = body(
    training={"maxSteps": 12, "batchSize": 2, "gradientAccumulation": 1, "maxLength": 64, "learningRate": 3e-3},
    checkpoints={"everySteps": 4, "keep": 2},
    resources={"gpus": 0, "cpu": "1", "memory": "2Gi", "processes": 1, "nodes": 2},
    placement={
        # One pod on each of the agent's nodes.
        "tolerations": [{"key": "finetune.dev/local-node", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {"finetune.dev/job": NAME}},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        },
    },
)


def _gone(read: object) -> bool:
    try:
        read()  # type: ignore[operator]
    except ApiException as exc:
        return exc.status == 404
    return False


def test_an_indexed_job_of_two_nodes_trains_across_the_agents_nodes_and_goes_with_its_finetunejob(
    jobs: Jobs,
    core: client.CoreV1Api,
    batch: client.BatchV1Api,
    namespace: str,
    finetune_crd: str,
    training_volumes: dict[str, Path],
) -> None:
    created = jobs.create(NAME, TWO_NODES)
    owner = Owner(NAME, namespace, created["metadata"]["uid"])
    spec = FineTuneJobSpec.model_validate(created["spec"])
    account, role, binding = rbac.identity(namespace)
    core.create_namespaced_service_account(namespace, account)
    client.RbacAuthorizationV1Api(jobs.api).create_namespaced_role(namespace, role)
    client.RbacAuthorizationV1Api(jobs.api).create_namespaced_role_binding(namespace, binding)
    core.create_namespaced_service(namespace, service(owner, spec))
    batch.create_namespaced_job(namespace, indexed_job(owner, spec, Settings()))

    wait_job_condition(batch, namespace, NAME, "Complete", timeout=420)
    pods = jobs.pods(NAME)
    assert {p["spec"]["nodeName"] for p in pods} == {"local-0", "local-1"}
    assert len({p["status"]["podIP"] for p in pods}) == 2
    summary = json.loads((training_volumes["outputs"] / NAME / "summary.json").read_text())
    assert (summary["worldSize"], summary["finalStep"], summary["ranksInStep"]) == (2, 12, True)
    assert (training_volumes["outputs"] / NAME / "adapter" / "adapter_model.safetensors").is_file()

    jobs.delete(NAME)
    wait_for(lambda: _gone(lambda: core.read_namespaced_service(NAME, namespace)), 60, "the Service to be collected")
    wait_for(lambda: _gone(lambda: batch.read_namespaced_job(NAME, namespace)), 60, "the Job to be collected")
    wait_for(lambda: not jobs.pods(NAME), 90, "the pods to be collected")

"""The trainer-status admission policy (charts/finetune-operator/files/trainer-status-policy.yaml)
tells a multi-node job's pod from a one-node job's pod by the job label the operator sets on its
pods, where their names cannot: the pod of index 1 of a multi-node job `gang` and the pod of a
one-node job `gang-1` are both named "gang-1-xxxxx".

Real operator, real Jobs and pods (unschedulable, so they wait and their tokens can be bound to
them, as the kubelet binds a mounted token), tokens from the TokenRequest API.
"""

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from finetune_api.constants import GROUP, PLURAL, VERSION
from finetune_api.multinode import COMPLETION_INDEX_ANNOTATION
from tests.fixtures.cluster import Cluster, token_client
from tests.support.harness import Jobs, OperatorProcess, trainer_identity_of, wait_for
from tests.support.specs import gpu_spec

pytestmark = pytest.mark.cluster

ACCOUNT = "finetune-trainer"
PATCH = {"status": {"progress": {"step": 3, "totalSteps": 6}}}
# More GPUs than any node has: the pods stay Pending.
UNSCHEDULABLE = {"gpus": 8, "gpuProduct": "Tesla-P40", "cpu": "2", "memory": "8Gi"}


def _pod(jobs: Jobs, job: str, index: int | None = None) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        for pod in jobs.pods(job):
            annotations = pod["metadata"].get("annotations") or {}
            if index is None or annotations.get(COMPLETION_INDEX_ANNOTATION) == str(index):
                meta: dict[str, Any] = pod["metadata"]
                return meta
        return None

    return wait_for(find, 60, f"a pod of {job}" + ("" if index is None else f" of index {index}"))


def test_a_pod_named_like_another_jobs_patches_only_its_own_job(
    cluster: Cluster, core: client.CoreV1Api, namespace: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create("gang", {**gpu_spec(), "resources": {**UNSCHEDULABLE, "nodes": 2}})
    jobs.create("gang-1", {**gpu_spec(), "resources": UNSCHEDULABLE})
    gang_pod, single_pod = _pod(jobs, "gang", 1), _pod(jobs, "gang-1")
    # The names alone are of one shape: "gang-1-<five characters>".
    assert gang_pod["name"].startswith("gang-1-") and single_pod["name"].startswith("gang-1-")
    wait_for(lambda: "finetune-trainer" in trainer_identity_of(jobs.api, namespace)["Role"], 60, "trainer identity")

    def as_pod(pod: dict[str, Any]) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(token_client(cluster, core, namespace, ACCOUNT, (pod["name"], pod["uid"])))

    def patch(api: client.CustomObjectsApi, job: str) -> Callable[[], object]:
        return lambda: api.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, job, PATCH)

    def allowed(call: Callable[[], object]) -> bool:
        try:
            call()
        except ApiException as exc:
            if exc.status == 403 and "own FineTuneJob" not in str(exc.body):
                return False  # the RoleBinding may take a moment to reach the authorizer cache
            raise
        return True

    def refusal(call: Callable[[], object]) -> str:
        with pytest.raises(ApiException) as caught:
            call()
        assert caught.value.status == 403, caught.value.body
        return str(caught.value.body)

    gang, single = as_pod(gang_pod), as_pod(single_pod)
    # Each patches its own job...
    wait_for(lambda: allowed(patch(gang, "gang")), 30, "the gang pod's own status patch")
    wait_for(lambda: allowed(patch(single, "gang-1")), 30, "the one-node pod's own status patch")
    assert jobs.status("gang")["progress"]["step"] == 3 and jobs.status("gang-1")["progress"]["step"] == 3
    # ...and not the other's, though each name has the shape of the other job's pods.
    said = refusal(patch(single, "gang"))
    assert f"pod {single_pod['name']} belongs to job gang-1, not gang" in said, said
    said = refusal(patch(gang, "gang-1"))
    assert f"pod {gang_pod['name']} belongs to job gang, not gang-1" in said, said

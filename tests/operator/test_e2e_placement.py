"""End to end on fake GPU nodes (KWOK): placement, scheduling messages, crash-safety, deletion,
the trainer's least privilege and the Hub token. The operator runs as a subprocess under its
own ServiceAccount bound to charts/finetune-operator/files/operator-rbac.yaml."""

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from finetune_api.constants import GROUP, LABEL_JOB, PLURAL, VERSION
from finetune_operator.crash_hook import CRASH_EXIT_CODE
from tests.support.harness import Jobs, OperatorProcess, trainer_identity_of, wait_for
from tests.support.specs import gpu_spec

pytestmark = pytest.mark.cluster

HUB_TOKEN = "hf_NeverShowThisValue0123456789"


def the_pod(jobs: Jobs, name: str) -> dict:
    return wait_for(lambda: (jobs.pods(name) or [None])[0], 60, f"a pod of {name}")


def test_p40_job_lands_on_a_p40_node_and_succeeds(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create("p40", gpu_spec())
    status = jobs.wait_phase("p40", "Succeeded", 120)
    pod = jobs.pods("p40")[0]
    spec = pod["spec"]
    container = spec["containers"][0]
    assert spec["nodeName"].startswith("gpu-p40-")
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "Tesla-P40"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    shm = next(v for v in spec["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/dev/shm"]["name"] == "shm"
    assert mounts["/etc/finetune"]["readOnly"] is True
    assert mounts["/mnt/output"].get("readOnly") in (None, False)
    assert status["output"]["claimName"] == "p40-output"
    assert {c["type"]: c["status"] for c in status["conditions"]}["Complete"] == "True"
    assert jobs.operator_events("p40") == []  # the status says it all


def test_a100_job_never_lands_on_a_p40(jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create("a100", gpu_spec(product="NVIDIA-A100-SXM4-80GB", precision="bf16"))
    jobs.wait_phase("a100", ("Running", "Succeeded"), 120)
    assert jobs.pods("a100")[0]["spec"]["nodeName"].startswith("gpu-a100-")


def test_more_gpus_than_any_node_has_stays_pending_with_the_schedulers_message_and_the_operators_warning(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create("huge", gpu_spec(gpus=8))

    def unschedulable() -> dict | None:
        cond = jobs.condition("huge", "Scheduled")
        return cond if cond.get("status") == "False" else None

    cond = wait_for(unschedulable, 90, "Scheduled=False on huge")
    assert "nodes are available" in cond["message"]
    assert "nvidia.com/gpu" in cond["message"]
    status = jobs.status("huge")
    assert status["phase"] == "Pending"
    # The scheduler's words stay on Scheduled, its own Warning on the pod; the message and the
    # operator's one Warning say what the scheduler cannot: no node will ever do, and what would.
    warned = jobs.condition("huge", "Schedulable")
    assert warned["status"] == "False" and status["message"] == f"TooManyGpusPerNode: {warned['message']}"
    pod = jobs.pods("huge")[0]["metadata"]["name"]
    assert "FailedScheduling" in {e["reason"] for e in jobs.events_with(pod, "FailedScheduling")}
    assert [e["reason"] for e in jobs.operator_events("huge")] == ["TooManyGpusPerNode"]


def test_memory_below_the_pods_plan_fails_wont_fit_before_any_job(jobs: Jobs, operator: OperatorProcess) -> None:
    """A model the planner knows by name (Llama-3.1-8B on one P40 plans a 6Gi pod) with 2Gi: Failed
    WontFit naming spec.resources.memory, and no Job ever; the same spec without memory runs,
    its pod sized from the plan."""
    known = {"source": {"hub": {"id": "meta-llama/Llama-3.1-8B"}}}
    short, sized = gpu_spec(gpus=1), gpu_spec(gpus=1)
    short["model"] = sized["model"] = known
    short["resources"]["memory"] = "2Gi"
    del sized["resources"]["memory"]
    jobs.create("short", short)
    jobs.create("sized", sized)
    jobs.wait_phase("short", "Failed", 60)
    failed = jobs.condition("short", "Failed")
    assert failed["reason"] == "WontFit"
    assert "spec.resources.memory 2.0 GiB is below the 6Gi of host memory" in failed["message"]
    assert jobs.events_with("short", "WontFit")
    pod = the_pod(jobs, "sized")
    assert pod["spec"]["containers"][0]["resources"]["limits"]["memory"] == "6Gi"
    names = [j.metadata.name for j in jobs.batch.list_namespaced_job(jobs.namespace).items]
    assert "short" not in names, names


def children_of(kube: client.ApiClient, namespace: str, name: str) -> dict[str, list[str]]:
    """A job's own children: its Job and, when the operator makes one, its output claim."""
    selector = f"{LABEL_JOB}={name}"
    core, batch = client.CoreV1Api(kube), client.BatchV1Api(kube)
    return {
        "Job": [o.metadata.name for o in batch.list_namespaced_job(namespace, label_selector=selector).items],
        "PersistentVolumeClaim": [
            o.metadata.name
            for o in core.list_namespaced_persistent_volume_claim(namespace, label_selector=selector).items
        ],
    }


ONE_IDENTITY = {
    "ServiceAccount": ["finetune-trainer"],
    "Role": ["finetune-trainer"],
    "RoleBinding": ["finetune-trainer"],
}


def test_operator_killed_between_two_creates_converges_with_one_of_each(
    kube: client.ApiClient, namespace: str, jobs: Jobs, start_operator
) -> None:
    # The output claim is created before the Job: exiting right after it stops exactly
    # between a job's two creates.
    crashing = start_operator(env={"FINETUNE_TEST_CRASH_AFTER": "PersistentVolumeClaim"}, wait=False)
    wait_for(crashing.healthy, 60, "the crashing operator to start")
    jobs.create("crash", gpu_spec())
    assert crashing.wait_exit(60) == CRASH_EXIT_CODE
    assert children_of(kube, namespace, "crash") == {"Job": [], "PersistentVolumeClaim": ["crash-output"]}
    assert trainer_identity_of(kube, namespace) == ONE_IDENTITY

    start_operator()
    jobs.wait_phase("crash", "Succeeded", 120)
    assert children_of(kube, namespace, "crash") == {"Job": ["crash"], "PersistentVolumeClaim": ["crash-output"]}
    assert trainer_identity_of(kube, namespace) == ONE_IDENTITY
    assert len(jobs.pods("crash")) == 1


def test_deleting_the_job_removes_every_owned_child_but_keeps_the_output(
    kube: client.ApiClient, namespace: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create("gone", gpu_spec(training={"maxSteps": 6}))
    jobs.wait_phase("gone", ("Running", "Succeeded"), 120)
    assert all(children_of(kube, namespace, "gone").values())
    jobs.delete("gone")

    def only_output_left() -> bool:
        left = children_of(kube, namespace, "gone")
        return not any(v for k, v in left.items() if k != "PersistentVolumeClaim") and not jobs.pods("gone")

    wait_for(only_output_left, 90, f"children of gone to be collected (left: {children_of(kube, namespace, 'gone')})")
    assert children_of(kube, namespace, "gone")["PersistentVolumeClaim"] == ["gone-output"]
    # The namespace's trainer identity serves the next job; it is no job's child.
    assert trainer_identity_of(kube, namespace) == ONE_IDENTITY


def test_the_trainer_identity_may_patch_its_own_status_and_nothing_else(
    cluster, core: client.CoreV1Api, namespace: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    from tests.fixtures.cluster import token_client

    for name in ("mine", "other"):
        jobs.create(name, gpu_spec(gpus=8))  # unschedulable: the pods wait, their tokens can be bound
    mine = the_pod(jobs, "mine")["metadata"]
    wait_for(lambda: trainer_identity_of(jobs.api, namespace) == ONE_IDENTITY, 60, "the trainer identity")
    account = "finetune-trainer"
    # A token as the kubelet mounts it into mine's pod: bound to that pod, which names the job.
    trainer = client.CustomObjectsApi(token_client(cluster, core, namespace, account, (mine["name"], mine["uid"])))
    patch = {"status": {"progress": {"step": 3, "totalSteps": 6}}}

    def allowed() -> bool:
        try:
            trainer.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "mine", patch)
        except ApiException as exc:
            if exc.status == 403 and "own FineTuneJob" not in str(exc.body):
                return False  # the RoleBinding may take a moment to reach the authorizer cache
            raise
        return True

    wait_for(allowed, 30, "the trainer's own status patch to be allowed")
    assert jobs.status("mine")["progress"]["step"] == 3

    def refused(call) -> ApiException:
        with pytest.raises(ApiException) as caught:
            call()
        assert caught.value.status == 403, caught.value.body
        return caught.value

    other = refused(
        lambda: trainer.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "other", patch)
    )
    # Two policies refuse it, by the pod's name and by its job label; the API server answers with
    # whichever it evaluates first.
    said = str(other.body)
    assert (
        f"pod {mine['name']} is not a pod of other" in said
        or f"pod {mine['name']} belongs to job mine, not other" in said
    ), said
    # A token of the same account bound to no pod (kubectl create token) patches nothing.
    unbound = client.CustomObjectsApi(token_client(cluster, core, namespace, account))
    assert "bound to no pod" in str(
        refused(
            lambda: unbound.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "mine", patch)
        ).body
    )
    refused(
        lambda: trainer.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "mine", {"spec": {"suspend": True}}
        )
    )
    refused(lambda: trainer.get_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "other"))
    refused(lambda: trainer.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL))
    trainer_core = client.CoreV1Api(trainer.api_client)
    refused(lambda: trainer_core.list_namespaced_pod(namespace))
    refused(lambda: trainer_core.list_namespaced_secret(namespace))
    refused(lambda: trainer_core.list_namespaced_config_map(namespace))


def test_the_hub_token_stays_in_its_secret(
    kube: client.ApiClient, core: client.CoreV1Api, namespace: str, jobs: Jobs, operator: OperatorProcess
) -> None:
    core.create_namespaced_secret(namespace, {"metadata": {"name": "hf"}, "stringData": {"token": HUB_TOKEN}})
    spec = gpu_spec()
    spec["model"] = {"source": {"hub": {"id": "org/gated", "tokenSecret": "hf"}}}
    jobs.create("hub", spec)
    jobs.wait_phase("hub", "Succeeded", 120)
    pod = jobs.pods("hub")[0]
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}

    batch = client.BatchV1Api(kube)
    job = kube.sanitize_for_serialization(batch.read_namespaced_job("hub", namespace))
    configmaps = [kube.sanitize_for_serialization(c) for c in core.list_namespaced_config_map(namespace).items]
    # Every Event of the run is posted before they are searched: the Job controller's Completed
    # is its last, and the operator posts none for a job that succeeds (Events for trouble only).
    jobs.events_with("hub", "Completed")
    assert jobs.operator_events("hub") == []
    events = [kube.sanitize_for_serialization(e) for e in core.list_namespaced_event(namespace).items]
    places = {
        "pod spec and annotations": pod,
        "job": job,
        "finetunejob": jobs.get("hub"),
        "configmaps": configmaps,
        "events": events,
    }
    for where, thing in places.items():
        assert HUB_TOKEN not in json.dumps(thing), f"the Hub token leaked into {where}"
    log = operator.log.read_text()
    assert "hub" in log  # the log did cover this job
    assert HUB_TOKEN not in log, "the Hub token leaked into the operator's log"

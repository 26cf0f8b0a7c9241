"""Progress lands on a real FineTuneJob: the trainer, as the namespace's trainer ServiceAccount
with the Role the operator grants it and a token bound to a pod of the job (as the kubelet
mounts it; the chart's admission policy checks that binding), patches status.progress and
status.lastCheckpoint and nothing else."""

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from finetune_api.constants import GROUP, PLURAL, TRAINER_SERVICE_ACCOUNT, VERSION
from finetune_operator.builders import rbac as trainer_rbac
from tests.support.harness import kubeconfig_for_token, service_account_token
from tests.support.install import finetune_crd_install

from .conftest import BASE_JOB, JobDir

pytestmark = [pytest.mark.cluster, pytest.mark.trainer]


def trainer_identity(kube: client.ApiClient, cluster: Any, job: dict[str, Any], folder: Path) -> Path:
    """The namespace's trainer identity as the operator makes it, and a kubeconfig with a token
    bound to a pod named as the job's Job names its pods (a stand-in pod: no kubelet runs it)."""
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    core = client.CoreV1Api(kube)
    rbac = client.RbacAuthorizationV1Api(kube)
    core.create_namespaced_service_account(namespace, trainer_rbac.service_account(namespace))
    rbac.create_namespaced_role(namespace, trainer_rbac.role(namespace))
    rbac.create_namespaced_role_binding(namespace, trainer_rbac.role_binding(namespace))
    pod = core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": f"{name}-x7k2q"},
            "spec": {
                "serviceAccountName": TRAINER_SERVICE_ACCOUNT,
                "nodeName": "no-such-node",  # never runs: it only anchors the token
                "containers": [{"name": "trainer", "image": "trainer"}],
            },
        },
    )
    token = service_account_token(
        core, namespace, TRAINER_SERVICE_ACCOUNT, seconds=3600, pod=(pod.metadata.name, pod.metadata.uid)
    )
    return kubeconfig_for_token(Path(cluster.kubeconfig), token, folder / "trainer.kubeconfig", namespace)


def test_progress_and_last_checkpoint_land_on_the_finetunejob(
    cluster: Any, kube: client.ApiClient, namespace: str, job_dir: JobDir, tmp_path: Path
) -> None:
    finetune_crd_install(kube)
    custom = client.CustomObjectsApi(kube)
    body = {**BASE_JOB, "metadata": {"name": "tiny", "namespace": namespace}}
    job = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    # What the operator owns must survive the trainer's patches untouched.
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "tiny", {"status": {"phase": "Running", "message": "owned by the operator"}}
    )
    kubeconfig = trainer_identity(kube, cluster, job, tmp_path)

    run = job_dir.run(env={"KUBECONFIG": str(kubeconfig)}, namespace=namespace)
    assert run.code == 0, run.stderr[-3000:]

    status = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "tiny")["status"]
    assert status["phase"] == "Running"
    assert status["message"] == "owned by the operator"
    progress = status["progress"]
    assert progress["step"] == progress["totalSteps"] == 30
    assert progress["percent"] == 100.0
    assert progress["loss"] == run.losses[30]
    assert {"epoch", "learningRate", "tokensPerSecond", "etaSeconds", "updatedAt"} <= set(progress)
    summary_counts = json.loads((job_dir.output / "summary.json").read_text())
    assert (progress["tokens"], progress["trainedTokens"]) == (
        summary_counts["tokens"],
        summary_counts["trainedTokens"],
    )
    last = status["lastCheckpoint"]
    assert last["step"] == 30
    assert last["path"] == str(job_dir.checkpoints / "checkpoint-30")
    summary = json.loads((job_dir.output / "summary.json").read_text())
    assert summary["statusPatches"]["failed"] == 0
    # throttled: checkpoints (3) and the end always send; steps only every 10 s
    assert 3 <= summary["statusPatches"]["sent"] < 30


def test_a_preference_runs_pairs_and_figures_land_on_the_finetunejob(
    cluster: Any, kube: client.ApiClient, namespace: str, job_dir: JobDir, tmp_path: Path
) -> None:
    """DPO's count (pairs) and figures pass the CRD's schema as the trainer sends them."""
    from .test_preference_progress import PREFERENCE_FIGURES, preference_run

    finetune_crd_install(kube)
    custom = client.CustomObjectsApi(kube)
    body = {
        **BASE_JOB,
        "metadata": {"name": "tiny", "namespace": namespace},
        "spec": {
            **BASE_JOB["spec"],
            "dataset": {**BASE_JOB["spec"]["dataset"], "format": "preference"},
            "training": {**BASE_JOB["spec"]["training"], "method": "dpo"},
        },
    }
    job = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    kubeconfig = trainer_identity(kube, cluster, job, tmp_path)

    last = preference_run(job_dir, "dpo", env={"KUBECONFIG": str(kubeconfig)}, namespace=namespace).of("progress")[-1]

    progress = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "tiny")["status"]["progress"]
    assert progress["pairs"] == last["pairs"] and "trainedTokens" not in progress
    assert progress["metrics"] == {name: last[name] for name in PREFERENCE_FIGURES}
    accuracy, margin = last["rewardAccuracy"], last["rewardMargin"]
    assert progress["metricsText"] == f"reward acc {accuracy:.2f} margin {margin:.3g}"

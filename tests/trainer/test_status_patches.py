"""Progress lands on a real FineTuneJob: the trainer, as the namespace's trainer ServiceAccount
with the Role the operator grants it and a token bound to a pod of the job (as the kubelet
mounts it; the chart's admission policy checks that binding), patches status.progress,
status.lastCheckpoint and status.sample and nothing else; its last status lands through an API
server that refuses it at first (tests/support/busy_apiserver.py), within a bound when it never
takes it. The status is read with a bounded wait: the patches come from a background thread."""

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from finetune_api.constants import GROUP, PLURAL, TRAINER_SERVICE_ACCOUNT, VERSION
from finetune_operator.builders import rbac as trainer_rbac
from finetune_trainer.reporting.status_patch import StatusReporter
from tests.support.busy_apiserver import BusyApiServer
from tests.support.harness import Jobs, kubeconfig_for_token, reported_the_end, service_account_token
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
                # Never scheduled, so never run: it only anchors the token. (Bound to a node that
                # does not exist, it was deleted by the pod garbage collector 40 s on, and the
                # token with it: on a loaded machine the trainer's patches got 401 and none landed.)
                "nodeSelector": {"finetune.dev/test": "no-node-has-this"},
                "containers": [{"name": "trainer", "image": "trainer"}],
            },
        },
    )
    token = service_account_token(
        core, namespace, TRAINER_SERVICE_ACCOUNT, seconds=3600, pod=(pod.metadata.name, pod.metadata.uid)
    )
    return kubeconfig_for_token(Path(cluster.kubeconfig), token, folder / "trainer.kubeconfig", namespace)


# The last status refused this many times: the sample's own patch and at least two of the
# tries `close` makes after it.
REFUSED = 3


def test_progress_checkpoint_and_sample_land_on_the_finetunejob_through_a_busy_api_server(
    cluster: Any, kube: client.ApiClient, namespace: str, job_dir: JobDir, tmp_path: Path
) -> None:
    from finetune_trainer.outputs.samples import status_sample

    finetune_crd_install(kube)
    custom = client.CustomObjectsApi(kube)
    body = {**BASE_JOB, "metadata": {"name": "tiny", "namespace": namespace}}
    job = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    # What the operator owns must survive the trainer's patches untouched.
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "tiny", {"status": {"phase": "Running", "message": "owned by the operator"}}
    )
    kubeconfig = trainer_identity(kube, cluster, job, tmp_path)
    # Every patch that carries the sample (the last status) is answered 503 until REFUSED were.
    busy = BusyApiServer(cluster.server, cluster.layout.pki, REFUSED, lambda patch: "sample" in patch["status"])

    with busy.running():
        proxied = busy.kubeconfig(kubeconfig, tmp_path / "busy.kubeconfig")
        run = job_dir.run(env={"KUBECONFIG": str(proxied)}, namespace=namespace)
    assert run.code == 0, run.stderr[-3000:]

    status = Jobs(kube, namespace).status_when("tiny", lambda s: reported_the_end(s, sample=True), "the last status")
    assert status["phase"] == "Running"
    assert status["message"] == "owned by the operator"
    progress = status["progress"]
    assert progress["step"] == progress["totalSteps"] == 30
    assert progress["percent"] == 100.0
    assert progress["loss"] == run.losses[30]
    assert {"epoch", "learningRate", "tokensPerSecond", "etaSeconds", "updatedAt"} <= set(progress)
    summary = json.loads((job_dir.output / "summary.json").read_text())
    assert (progress["tokens"], progress["trainedTokens"]) == (summary["tokens"], summary["trainedTokens"])
    last = status["lastCheckpoint"]
    assert last["step"] == 30
    assert last["path"] == str(job_dir.checkpoints / "checkpoint-30")
    samples = Path(summary["samplesPath"])
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert status["sample"] == status_sample(rows, samples)
    # Every failure is one the busy server made: the rest went through the real server's RBAC
    # and admission. Throttled: checkpoints (3) and the end always send; steps only every 10 s.
    assert busy.refused == REFUSED
    assert summary["statusPatches"]["failed"] == REFUSED
    assert 3 <= summary["statusPatches"]["sent"] < 30


def test_the_last_status_is_tried_only_until_its_deadline(
    cluster: Any, kube: client.ApiClient, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An API server that never takes it: `close` retries, backing off, and returns by its
    deadline with the reporter's thread ended (none left mid-request at the interpreter's exit)."""
    finetune_crd_install(kube)
    custom = client.CustomObjectsApi(kube)
    job = custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, {**BASE_JOB, "metadata": {"name": "tiny", "namespace": namespace}}
    )
    kubeconfig = trainer_identity(kube, cluster, job, tmp_path)
    busy = BusyApiServer(cluster.server, cluster.layout.pki, float("inf"))

    with busy.running():
        monkeypatch.setenv("KUBECONFIG", str(busy.kubeconfig(kubeconfig, tmp_path / "busy.kubeconfig")))
        reporter = StatusReporter.from_environment("tiny", namespace)
        assert reporter is not None
        reporter.progress({"step": 30, "totalSteps": 30, "loss": 1.5})
        started = time.monotonic()
        reporter.close(4.0)
        took = time.monotonic() - started

    assert not reporter._thread.is_alive()
    assert took < 4.5, took
    # Backing off 0.5 s, 1 s, then to the last second that leaves room for a try: each refused.
    assert busy.refused == reporter.failed >= 3 and reporter.sent == 0
    assert "progress" not in Jobs(kube, namespace).status("tiny")


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

    progress = Jobs(kube, namespace).status_when("tiny", reported_the_end, "the last progress")["progress"]
    assert progress["pairs"] == last["pairs"] and "trainedTokens" not in progress
    assert progress["metrics"] == {name: last[name] for name in PREFERENCE_FIGURES}
    accuracy, margin = last["rewardAccuracy"], last["rewardMargin"]
    assert progress["metricsText"] == f"reward acc {accuracy:.2f} margin {margin:.3g}"

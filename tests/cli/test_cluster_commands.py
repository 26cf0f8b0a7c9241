"""`ftjob submit | list | status | watch | logs | suspend | resume | delete` against the real
control plane (tests/fixtures/cluster.py).

Most tests run without an operator: they create FineTuneJobs with `ftjob submit` and then write
status themselves, the way the operator and the trainer would, to drive `status` and `watch`
through exactly the states they must render. The last test runs the real operator and trainer.
"""

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from finetune_api.constants import API_VERSION, GROUP, KIND, LABEL_COMPONENT, LABEL_JOB, PLURAL, VERSION
from tests.fixtures.cluster import Cluster, wait_for, wait_pod_phase
from tests.support.ci import require
from tests.support.cli import PYTHONPATH, assert_one_line_error
from tests.support.cli import ftjob_process as ftjob
from tests.support.specs import body as spec_body

pytestmark = pytest.mark.cluster


def manifest(tmp_path: Path, name: str, **spec: Any) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec_body(**spec)})
    )
    return path


def submitted(tmp_path: Path, namespace: str, name: str, **spec: Any) -> str:
    result = ftjob("submit", str(manifest(tmp_path, name, **spec)), "-n", namespace)
    assert result.returncode == 0, result.stderr
    return name


def patch_status(custom: client.CustomObjectsApi, namespace: str, name: str, status: dict[str, Any]) -> None:
    """Write status as the operator/trainer would (merge patch on the status subresource)."""
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, {"status": status})


def get(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return found
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_submit_validates_then_creates_and_list_shows_it(
    finetune_crd: str, namespace: str, custom: client.CustomObjectsApi, tmp_path: Path
):
    result = ftjob("submit", str(manifest(tmp_path, "tiny")), "-n", namespace)
    assert result.returncode == 0, result.stderr
    assert f"finetunejob.finetune.dev/tiny created in namespace {namespace}" in result.stdout
    created = get(custom, namespace, "tiny")
    assert created is not None and created["spec"]["training"]["maxSteps"] == 6

    listing = ftjob("list", "-n", namespace)
    assert listing.returncode == 0, listing.stderr
    header, row = listing.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "STEP", "LOSS", "GPUS", "AGE", "REASON"]
    assert row.split()[0] == "tiny"
    everywhere = ftjob("list", "-A")
    assert namespace in everywhere.stdout


def test_submit_twice_and_server_side_rejection_are_one_line(
    finetune_crd: str, namespace: str, custom: client.CustomObjectsApi, tmp_path: Path
):
    submitted(tmp_path, namespace, "twice")
    again = ftjob("submit", str(manifest(tmp_path, "twice")), "-n", namespace)
    assert_one_line_error(again, "finetunejob twice already exists")
    # metadata.name too long for the CRD's CEL rule: offline validation catches it first.
    too_long = "x" * 60
    rejected = ftjob("submit", str(manifest(tmp_path, too_long)), "-n", namespace)
    assert_one_line_error(rejected, "metadata.name")
    assert get(custom, namespace, too_long) is None


def test_bad_input_creates_nothing_and_prints_one_line(
    finetune_crd: str, namespace: str, custom: client.CustomObjectsApi, tmp_path: Path
):
    assert_one_line_error(ftjob("submit", str(tmp_path / "missing.yaml"), "-n", namespace), "no such file")
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: finetune.dev/v1alpha1\nkind: FineTuneJob\nspec: [oops\n")
    assert_one_line_error(ftjob("submit", str(broken), "-n", namespace), "invalid YAML")
    invalid = manifest(tmp_path, "invalid", lora={"r": 0})
    assert_one_line_error(ftjob("submit", str(invalid), "-n", namespace), "spec.lora.r", "nothing submitted")
    assert get(custom, namespace, "invalid") is None


@pytest.mark.parametrize(
    "command", [["status"], ["watch", "--timeout", "5"], ["logs"], ["suspend"], ["resume"], ["delete"]]
)
def test_unknown_job_is_one_line(finetune_crd: str, namespace: str, command: list[str]):
    result = ftjob(command[0], "nope", *command[1:], "-n", namespace)
    assert_one_line_error(result, f"finetunejob nope not found in namespace {namespace}")


def test_unreachable_cluster_and_missing_kubeconfig_are_one_line(tmp_path: Path):
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "team"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    assert_one_line_error(
        ftjob("list", "--kubeconfig", str(path)), "cannot reach the API server at https://127.0.0.1:1"
    )
    assert_one_line_error(ftjob("list", "--kubeconfig", str(tmp_path / "none")), "no such file")
    assert_one_line_error(ftjob("list", "--kubeconfig", str(path), "--context", "other"), "kubeconfig")


def test_namespace_comes_from_the_kubeconfig_context(
    cluster: Cluster, finetune_crd: str, namespace: str, tmp_path: Path
):
    submitted(tmp_path, namespace, "from-context")
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    for context in admin["contexts"]:
        context["context"]["namespace"] = namespace
    for entry in admin["clusters"]:
        authority = entry["cluster"].get("certificate-authority")
        if authority and not Path(authority).is_absolute():
            entry["cluster"]["certificate-authority"] = str(Path(cluster.kubeconfig).parent / authority)
    for entry in admin["users"]:
        for key in ("client-certificate", "client-key"):
            if entry["user"].get(key) and not Path(entry["user"][key]).is_absolute():
                entry["user"][key] = str(Path(cluster.kubeconfig).parent / entry["user"][key])
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(admin))
    result = ftjob("status", "from-context", env={"KUBECONFIG": str(path)})
    assert result.returncode == 0, result.stderr
    assert f"Namespace:   {namespace}" in result.stdout


def test_status_shows_conditions_progress_checkpoint_and_output(
    finetune_crd: str, namespace: str, custom: client.CustomObjectsApi, tmp_path: Path
):
    submitted(tmp_path, namespace, "shown")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    patch_status(
        custom,
        namespace,
        "shown",
        {
            "phase": "Running",
            "conditions": [
                {
                    "type": "Validated",
                    "status": "True",
                    "reason": "SpecValid",
                    "message": "ok",
                    "lastTransitionTime": now,
                },
                {
                    "type": "Running",
                    "status": "True",
                    "reason": "TrainerRunning",
                    "message": "step 12 of 30",
                    "lastTransitionTime": now,
                },
            ],
            "progress": {
                "step": 12,
                "totalSteps": 30,
                "percent": 40.0,
                "loss": 2.3456,
                "tokensPerSecond": 1234.5,
                "etaSeconds": 65,
                "epoch": 0.4,
            },
            "lastCheckpoint": {"step": 10, "path": "/mnt/output/shown/checkpoints/checkpoint-10", "time": now},
            "output": {"claimName": "outputs", "adapterPath": "/mnt/output/shown/adapter"},
            "restarts": 1,
            "startTime": now,
            "evaluation": {
                "step": 30,
                "base": {"loss": 2.31, "perplexity": 10.07},
                "tuned": {"loss": 1.05, "perplexity": 2.86},
                "summary": "loss 2.31 -> 1.05",
            },
        },
    )
    result = ftjob("status", "shown", "-n", namespace)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Phase:       Running" in out
    assert "step 12/30 (40%)" in out and "loss 2.3456" in out and "1,234 tok/s" in out and "ETA 1m05s" in out
    assert "Checkpoint:  step 10 at /mnt/output/shown/checkpoints/checkpoint-10" in out
    assert "adapter /mnt/output/shown/adapter" in out and "claim outputs" in out
    assert "Restarts:    1" in out
    assert "Evaluation:  loss 2.31 -> 1.05 (tuned at step 30)" in out
    assert "TrainerRunning" in out and "SpecValid" in out
    as_json = ftjob("status", "shown", "-n", namespace, "-o", "json")
    assert '"totalSteps": 30' in as_json.stdout


def test_a_preference_jobs_figures_survive_the_schema_and_read_in_short(
    finetune_crd: str, namespace: str, custom: client.CustomObjectsApi, tmp_path: Path
):
    """What the trainer of a DPO job patches (tests/trainer/test_preference_progress.py makes it):
    pairs and the method's figures are kept by the CRD's schema, and `ftjob status` and
    `kubectl get -o wide` (the Metrics column) show the short text."""
    from hack.cluster import binaries

    submitted(
        tmp_path,
        namespace,
        "prefers",
        dataset={**spec_body()["dataset"], "format": "preference"},
        training={**spec_body()["training"], "method": "dpo", "dpo": {"beta": 0.2}},
    )
    metrics = {"rewardAccuracy": 0.9375, "rewardMargin": 1.2345, "rewardChosen": 0.61, "logpRejected": -41.5}
    progress = {"step": 12, "totalSteps": 30, "loss": 0.2345, "tokens": 9000, "pairs": 96}
    patch_status(
        custom,
        namespace,
        "prefers",
        {
            "phase": "Running",
            "progress": {**progress, "metrics": metrics, "metricsText": "reward acc 0.94 margin 1.23"},
        },
    )
    job = get(custom, namespace, "prefers")
    assert job is not None and job["spec"]["training"]["dpo"] == {"beta": 0.2, "lossType": "sigmoid"}
    kept = job["status"]["progress"]
    assert kept["metrics"] == metrics and kept["pairs"] == 96
    shown = ftjob("status", "prefers", "-n", namespace)
    assert shown.returncode == 0, shown.stderr
    assert "loss 0.2345, reward acc 0.94 margin 1.23" in shown.stdout
    kubectl = binaries.resolve("kubectl")
    assert kubectl is not None
    table = subprocess.run(
        [str(kubectl), "get", "ftj", "prefers", "-n", namespace, "-o", "wide"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    header, row = table.splitlines()
    assert "METRICS" in header.split() and "reward acc 0.94 margin 1.23" in row
    narrow = subprocess.run(
        [str(kubectl), "get", "ftj", "prefers", "-n", namespace], capture_output=True, text=True, check=True
    ).stdout
    assert "METRICS" not in narrow and "reward" not in narrow


def start_watch(namespace: str, name: str, *extra: str) -> subprocess.Popen[str]:
    import os

    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    return subprocess.Popen(
        [sys.executable, "-m", "finetune_cli", "watch", name, "-n", namespace, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_watch_follows_progress_and_exits_0_on_succeeded(
    finetune_crd: str, namespace: str, custom: client.CustomObjectsApi, tmp_path: Path
):
    submitted(tmp_path, namespace, "winner")
    patch_status(custom, namespace, "winner", {"phase": "Running"})
    watcher = start_watch(namespace, "winner", "--timeout", "60")
    assert watcher.stdout is not None
    # Its first line means it has read the job; the watch resumes from that version, so no
    # later change can slip past it.
    first = watcher.stdout.readline()
    assert first.startswith("Running"), first + watcher.stderr.read() if watcher.stderr else first
    for step in (1, 15, 30):
        patch_status(
            custom,
            namespace,
            "winner",
            {
                "progress": {
                    "step": step,
                    "totalSteps": 30,
                    "loss": 3.0 - step / 20,
                    "tokensPerSecond": 100.0 * step,
                    "etaSeconds": (30 - step) * 2,
                }
            },
        )
        time.sleep(0.5)
    patch_status(
        custom, namespace, "winner", {"phase": "Succeeded", "output": {"adapterPath": "/mnt/output/winner/adapter"}}
    )
    rest, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, err
    out = first + rest
    assert "step 1/30 (3%)" in out and "step 15/30 (50%)" in out and "step 30/30 (100%)" in out
    assert "[############------------] step 15/30" in out
    assert "ETA 30s" in out and "loss 2.2500" in out
    assert "finetunejob winner succeeded: adapter at /mnt/output/winner/adapter" in out


def test_watch_exits_non_zero_with_the_reason_on_failed(
    finetune_crd: str, namespace: str, custom: client.CustomObjectsApi, tmp_path: Path
):
    submitted(tmp_path, namespace, "loser")
    watcher = start_watch(namespace, "loser", "--timeout", "60")
    assert watcher.stdout is not None
    assert watcher.stdout.readline().startswith("Pending")
    patch_status(
        custom,
        namespace,
        "loser",
        {
            "phase": "Failed",
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "NonFiniteLoss",
                    "message": "loss was nan at step 3",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        },
    )
    _, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 1
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == ["error: finetunejob loser failed: NonFiniteLoss: loss was nan at step 3"]


def test_watch_gives_up_after_its_timeout(finetune_crd: str, namespace: str, tmp_path: Path):
    submitted(tmp_path, namespace, "slow")
    started = time.monotonic()
    result = ftjob("watch", "slow", "-n", namespace, "--timeout", "3")
    assert result.returncode == 124
    assert 2.5 < time.monotonic() - started < 60
    assert_one_line_error(result, "still Pending after 3s")


def test_suspend_resume_and_delete(finetune_crd: str, namespace: str, custom: client.CustomObjectsApi, tmp_path: Path):
    submitted(tmp_path, namespace, "paused")
    result = ftjob("suspend", "paused", "-n", namespace)
    assert result.returncode == 0 and "suspended" in result.stdout, result.stderr
    job = get(custom, namespace, "paused")
    assert job is not None and job["spec"]["suspend"] is True
    result = ftjob("resume", "paused", "-n", namespace)
    assert result.returncode == 0 and "resumed" in result.stdout, result.stderr
    job = get(custom, namespace, "paused")
    assert job is not None and job["spec"]["suspend"] is False
    result = ftjob("delete", "paused", "-n", namespace)
    assert result.returncode == 0 and "deleted" in result.stdout, result.stderr
    wait_for(lambda: get(custom, namespace, "paused") is None, 30, "the job to be gone")


def trainer_pod(core: client.CoreV1Api, namespace: str, job: str, name: str, script: str) -> str:
    """A pod shaped like the operator's trainer pod, run by the node agent on local-0."""
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name, "labels": {LABEL_JOB: job, LABEL_COMPONENT: "trainer"}},
            "spec": {
                "nodeName": "local-0",
                "restartPolicy": "Never",
                "containers": [{"name": "trainer", "image": "trainer:test", "command": ["python", "-c", script]}],
            },
        },
    )
    return name


LOG_SCRIPT = "import time\nfor i in range(4):\n    print(f'trainer line {i}', flush=True)\n    time.sleep(0.7)\n"


def test_logs_print_the_newest_trainer_pod(
    cluster: Cluster, finetune_crd: str, namespace: str, core: client.CoreV1Api, tmp_path: Path
):
    submitted(tmp_path, namespace, "talker")
    logs_dir = ["--logs-dir", str(cluster.layout.pods)]
    assert_one_line_error(ftjob("logs", "talker", "-n", namespace, *logs_dir), "has no trainer pod")
    old = trainer_pod(core, namespace, "talker", "talker-old", "print('attempt one')")
    wait_pod_phase(core, namespace, old, {"Succeeded", "Failed"}, timeout=120)
    time.sleep(1.1)  # creation timestamps have one-second resolution
    new = trainer_pod(core, namespace, "talker", "talker-new", LOG_SCRIPT)
    wait_pod_phase(core, namespace, new, {"Running", "Succeeded"}, timeout=120)
    followed = ftjob("logs", "talker", "-n", namespace, "-f", *logs_dir, timeout=120)
    assert followed.returncode == 0, followed.stderr
    assert [f"trainer line {i}" for i in range(4)] == [
        line for line in followed.stdout.splitlines() if line.startswith("trainer line")
    ]
    assert "attempt one" not in followed.stdout
    wait_pod_phase(core, namespace, new, {"Succeeded"}, timeout=60)
    once = ftjob("logs", "talker", "-n", namespace, *logs_dir)
    assert once.returncode == 0, once.stderr
    assert "trainer line 3" in once.stdout


@pytest.mark.trainer
def test_full_run_with_the_operator_and_the_real_trainer(
    cluster: Cluster, start_operator: Any, training_volumes: dict[str, Path], namespace: str, tmp_path: Path
):
    start_operator()
    path = manifest(
        tmp_path,
        "full",
        training={"maxSteps": 6, "batchSize": 2, "gradientAccumulation": 1, "maxLength": 64, "learningRate": 3e-3},
    )
    result = ftjob("submit", str(path), "-n", namespace)
    assert result.returncode == 0, result.stderr
    watched = ftjob("watch", "full", "-n", namespace, "--timeout", "420", timeout=480)
    assert watched.returncode == 0, watched.stderr + watched.stdout
    assert "step 6/6 (100%)" in watched.stdout and "succeeded" in watched.stdout
    status = ftjob("status", "full", "-n", namespace)
    assert "Phase:       Succeeded" in status.stdout
    assert "Checkpoint:  step 6" in status.stdout and "Output:" in status.stdout
    logs = ftjob("logs", "full", "-n", namespace, "--logs-dir", str(cluster.layout.pods))
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.strip(), "the trainer printed nothing"


def test_kubectl_runs_it_as_the_finetune_plugin(cluster: Cluster, finetune_crd: str, namespace: str, tmp_path: Path):
    import os

    kubectl = cluster.layout.bin / "kubectl"
    plugin = Path(sys.executable).parent / "kubectl-finetune"
    require(kubectl.exists(), f"kubectl at {kubectl}")
    require(plugin.exists(), f"{plugin} (`make dev` installs the project's scripts)")
    submitted(tmp_path, namespace, "plugged")
    env = {**os.environ, "PATH": f"{plugin.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(
        [str(kubectl), "finetune", "status", "plugged", "-n", namespace],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Name:        plugged" in result.stdout

"""`ftjob compare` against the real control plane: the jobs' differing settings and their figures,
from evaluation.json where the output claim holds one (read through the API server), else from
status.evaluation; with --status-only no pod is started."""

import json
from typing import Any

import pytest
from kubernetes import client

from finetune_api.constants import GROUP, PLURAL, VERSION
from tests.fixtures.cluster import Cluster
from tests.support.cli import REPO, assert_one_line_error, ftjob
from tests.support.harness import Jobs, volume_folder, wait_for
from tests.support.install import make_claim, wait_bound
from tests.support.specs import body

pytestmark = pytest.mark.cluster

UPLOAD_PODS = "finetune.dev/component=upload"


def evaluation(base: float, tuned: float) -> dict[str, Any]:
    return {"step": 6, "base": {"loss": base, "perplexity": 10.0}, "tuned": {"loss": tuned}, "summary": "x"}


def test_compare_puts_the_differing_settings_and_the_figures_in_one_table(
    cluster: Cluster, finetune_crd: str, jobs: Jobs, kube: client.ApiClient, core: client.CoreV1Api, namespace: str
) -> None:
    make_claim(core, namespace, "outputs")
    wait_bound(core, namespace, "outputs")
    jobs.create("fast", body(training={**body()["training"], "learningRate": 0.01}))
    jobs.create("still", body(training={**body()["training"], "learningRate": 1e-9}))
    custom = client.CustomObjectsApi(kube)
    for name, figures in (("fast", evaluation(2.31, 1.05)), ("still", evaluation(2.31, 2.3))):
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": {"evaluation": figures}}
        )
    # Only `fast` has written its evaluation.json (the spec's folder: the job's name on the claim).
    folder = volume_folder(REPO, namespace, "outputs") / "fast"
    folder.mkdir(parents=True)
    table = [{"name": "loss", "base": 2.31, "tuned": 1.05, "better": "lower"}]
    table.append({"name": "rougeL", "base": 0.1, "tuned": 0.9, "better": "higher"})
    (folder / "evaluation.json").write_text(json.dumps({"version": 1, "step": 6, "figures": table}))

    result = ftjob("compare", "fast", "still", "-n", namespace)
    assert result.returncode == 0, result.stderr
    rows = {line.split("   ")[0].strip(): line.split()[1:] for line in result.stdout.splitlines() if line.strip()}
    assert rows["training.learningRate"] == ["0.01", "1e-09"]
    assert "training.maxSteps" not in rows and "lora.r" not in rows  # the same in both: left out
    assert rows["evaluation"] == ["evaluation.json", "status"]
    assert " ".join(rows["loss"]) == "2.31 -> 1.05 (better) 2.31 -> 2.3"
    assert rows["rougeL"] == ["0.1", "->", "0.9", "(better)", "-"]
    assert rows["perplexity"] == ["-", "10", "->", "-"]

    no_pods = lambda: not core.list_namespaced_pod(namespace, label_selector=UPLOAD_PODS).items  # noqa: E731
    wait_for(lambda: no_pods() or None, 30, "the pod that read the claim to go")
    quick = ftjob("compare", "fast", "still", "--status-only", "-o", "json", "-n", namespace)
    assert quick.returncode == 0, quick.stderr
    out = json.loads(quick.stdout)
    assert out["settings"] == {"training.learningRate": [0.01, 1e-9]}
    assert [job["source"] for job in out["jobs"]] == ["status", "status"]
    assert out["jobs"][1]["figures"]["loss"] == {"base": 2.31, "tuned": 2.3, "better": None}
    assert no_pods()  # --status-only started none


def test_compare_needs_two_jobs_and_names_a_missing_one(cluster: Cluster, finetune_crd: str, namespace: str) -> None:
    assert_one_line_error(ftjob("compare", "a", "a", "-n", namespace), "JOB: name two jobs or more")
    assert_one_line_error(ftjob("compare", "a", "b", "-n", namespace), "finetunejob a not found")

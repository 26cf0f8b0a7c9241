"""`ftjob report` against the real control plane: it finds the job's output claim and folder (from
status.output, else from the spec, as the operator would), reads report.html through the API
server's pod proxy and the upload pod, and writes it; a job without one yet is one line."""

import sys
from pathlib import Path
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


@pytest.fixture
def outputs(cluster: Cluster, core: client.CoreV1Api, namespace: str, finetune_crd: str) -> Path:
    """The claim `outputs` (the jobs' output claim), its folder on this machine."""
    make_claim(core, namespace, "outputs")
    wait_bound(core, namespace, "outputs")
    return volume_folder(REPO, namespace, "outputs")


def patch_status(kube: client.ApiClient, namespace: str, name: str, status: dict[str, Any]) -> None:
    client.CustomObjectsApi(kube).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": status}
    )


def test_report_is_read_from_the_claim_and_a_job_without_one_is_one_line(
    jobs: Jobs, kube: client.ApiClient, core: client.CoreV1Api, namespace: str, outputs: Path, tmp_path: Path
) -> None:
    # One job the operator reported on (status.output: another folder than the job's name), one it has not.
    jobs.create("tuned", body(output={"pvc": {"claimName": "outputs", "path": "runs/tuned"}}))
    jobs.create("fresh", body())
    patch_status(
        kube, namespace, "tuned", {"output": {"claimName": "outputs", "adapterPath": "/mnt/output/runs/tuned/adapter"}}
    )
    page = "<!DOCTYPE html><html><body><h1>FineTuneJob tuned</h1>" + "é" * 50_000 + "</body></html>\n"
    (outputs / "runs" / "tuned").mkdir(parents=True)
    (outputs / "runs" / "tuned" / "report.html").write_text(page, encoding="utf-8")

    target, opened = tmp_path / "tuned.html", tmp_path / "opened"
    # --open hands the file's URL to the browser $BROWSER names: here, a program that writes it down.
    browser = f"{sys.executable} -c 'import sys; open(sys.argv[2], \"w\").write(sys.argv[1])' %s {opened}"
    result = ftjob("report", "tuned", "-o", str(target), "--open", "-n", namespace, env={"BROWSER": browser})
    assert result.returncode == 0, result.stderr
    assert target.read_text(encoding="utf-8") == page
    assert f"{target}: report of finetunejob tuned, {len(page.encode()):,} bytes (claim outputs)" in result.stdout
    assert wait_for(lambda: opened.is_file() and opened.read_text(), 10, "the browser") == target.as_uri()

    missing = ftjob("report", "fresh", "-o", str(tmp_path / "fresh.html"), "-n", namespace)
    assert_one_line_error(
        missing, "finetunejob fresh (Pending) has not written report.html yet", "path 'fresh/report.html'"
    )
    assert not (tmp_path / "fresh.html").exists()
    # The pods it started are gone once it has read.
    wait_for(lambda: not core.list_namespaced_pod(namespace, label_selector=UPLOAD_PODS).items or None, 30, "no pod")


def test_bad_input_is_one_line_naming_it(cluster: Cluster, finetune_crd: str, namespace: str, tmp_path: Path) -> None:
    assert_one_line_error(
        ftjob("report", "nope", "-o", str(tmp_path / "x.html"), "-n", namespace), "finetunejob nope not found"
    )
    assert_one_line_error(
        ftjob("report", "nope", "-o", str(tmp_path / "no" / "x.html")), f"no folder {tmp_path / 'no'}"
    )
    assert_one_line_error(ftjob("report", "nope", "-o", str(tmp_path)), "a folder; name a file")

"""One verdict: the same specs fed to `ftjob plan` (a user's process, reading the local cluster's
nodes through its kubeconfig) and to the operator's `decide` (the nodes as its watch cache holds
them, read from the same cluster) come out the same: fits, WontFit (the spec's, for good: the
operator fails the job before any Job), or the nodes' reason (the operator warns and waits)."""

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from finetune_operator.decide import Observed, decide
from finetune_operator.settings import Settings
from finetune_plan.nodes import facts
from tests.support.cli import REPO, ftjob_process

pytestmark = pytest.mark.cluster

EXAMPLE_70B = yaml.safe_load((REPO / "examples" / "llama-3.3-70b-4xp40.yaml").read_text())
EXAMPLE_TINY = yaml.safe_load((REPO / "examples" / "tiny-job.yaml").read_text())
UID = "0000-uid"

# (name, the 70B example's resources changed to, the verdict both must give)
TABLE: list[tuple[str, dict[str, Any], str]] = [
    ("fits", {}, "Fits"),
    ("sixteen-gpus", {"gpus": 16}, "TooManyGpusPerNode"),
    ("five-nodes", {"nodes": 5}, "TooFewNodes"),
    ("no-such-product", {"gpuProduct": "NVIDIA-H100-80GB-HBM3"}, "NoNodeOfProduct"),
    ("two-gpus", {"gpus": 2}, "WontFit"),
    ("memory-short", {"memory": "16Gi"}, "WontFit"),
    ("memory-above-every-node", {"memory": "300Gi"}, "TooLittleHostMemory"),
]


def manifest(name: str, resources: dict[str, Any]) -> dict[str, Any]:
    job = yaml.safe_load(yaml.safe_dump(EXAMPLE_70B))
    job["metadata"]["name"] = name
    job["spec"]["resources"].update(resources)
    return job


def cli_verdict(path: Path) -> str:
    result = ftjob_process("plan", str(path), "--json")
    assert result.returncode in (0, 3), result.stderr
    plan = yaml.safe_load(result.stdout)
    assert (result.returncode == 0) == plan["fits"]
    return str(plan["verdict"]["reason"]) if plan.get("verdict") else "Fits"


def checking(name: str) -> dict[str, Any]:
    """The job's input check under way: the operator's status before its GPU Job exists."""
    owner = [{"kind": "FineTuneJob", "name": name, "uid": UID, "controller": True}]
    return {"metadata": {"name": f"{name}-preflight", "uid": "check-uid", "ownerReferences": owner}, "status": {}}


def operator_verdict(job: dict[str, Any], nodes: tuple[Any, ...]) -> str:
    name = job["metadata"]["name"]
    body = {**job, "metadata": {"name": name, "namespace": "team-a", "uid": UID, "generation": 1}}
    seen = Observed(
        namespace="team-a",
        name=name,
        settings=Settings(),
        now="2026-01-01T00:00:00Z",
        body=body,
        preflight=checking(name),
        nodes=nodes,
    )
    actions = decide(seen)
    assert actions.status_patch is not None
    conditions = {c["type"]: c for c in actions.status_patch["conditions"]}
    if "Failed" in conditions:
        return str(conditions["Failed"]["reason"])
    said = conditions.get("Schedulable")
    return str(said["reason"]) if said and said["status"] == "False" else "Fits"


def test_the_cli_and_the_operator_give_one_verdict_on_each_spec(cluster: Any, core: client.CoreV1Api, tmp_path: Path):
    listed = core.api_client.sanitize_for_serialization(core.list_node().items)
    nodes = tuple(f for f in (facts(n) for n in listed) if f is not None)
    assert {n.product for n in nodes} >= {"Tesla-P40"}
    verdicts = {}
    for name, resources, expected in TABLE:
        job = manifest(name, resources)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(job))
        verdicts[name] = (cli_verdict(path), operator_verdict(job, nodes), expected)
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(yaml.safe_dump(EXAMPLE_TINY))  # the CPU: no GPU node is asked for, nothing to refuse
    verdicts["cpu"] = (cli_verdict(tiny), operator_verdict(EXAMPLE_TINY, nodes), "Fits")
    assert {k: v[:2] for k, v in verdicts.items()} == {k: (v[2], v[2]) for k, v in verdicts.items()}

"""Run the real helm binary against the chart and parse what it renders.

helm comes from the same versioned binary cache as the control plane (`hack.cluster.binaries`);
when it is missing it is built once from the Go module proxy, like every other binary there.
"""

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from hack.cluster.binaries import K8S_VERSION

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "finetune-operator"
RULES_FILE = CHART / "files" / "operator-rbac.yaml"
ALL_ON_VALUES = REPO / "tests" / "chart" / "values-all-on.yaml"
OFFLINE_VALUES = REPO / "tests" / "chart" / "values-offline.yaml"
RELEASE = "ft"


def helm_binary() -> Path:
    if configured := os.environ.get("HELM"):
        return Path(configured)
    from hack.cluster import binaries
    from hack.cluster.layout import Layout

    found = binaries.resolve("helm")
    if found is None:
        found = binaries.ensure(Layout.for_repo())["helm"]
    return found


def helm(
    *args: str, kubeconfig: Path | None = None, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(REPO / ".cache" / "helm" / "cache"),
        "HELM_CONFIG_HOME": str(REPO / ".cache" / "helm" / "config"),
        "HELM_DATA_HOME": str(REPO / ".cache" / "helm" / "data"),
    }
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    result = subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}{result.stdout}")
    return result


def template_args(
    values: Sequence[Path] = (), sets: Sequence[str] = (), namespace: str = "finetune-system", offline: bool = True
) -> list[str]:
    """`helm template` of the chart; `offline` layers OFFLINE_VALUES (what no cluster tells
    `helm template`) under `values`."""
    # helm built with `go install` assumes Kubernetes v1.20 when no cluster is asked; render for
    # the version the local control plane runs.
    args = ["template", RELEASE, str(CHART), "--namespace", namespace, "--kube-version", K8S_VERSION]
    for path in [OFFLINE_VALUES] if offline else []:
        args += ["--values", str(path)]
    for path in values:
        args += ["--values", str(path)]
    for item in sets:
        args += ["--set", item]
    return args


def render(
    values: Sequence[Path] = (), sets: Sequence[str] = (), namespace: str = "finetune-system"
) -> list[dict[str, Any]]:
    """The objects `helm template` renders (templates only: Helm never templates crds/)."""
    out = helm(*template_args(values, sets, namespace)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objects: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def operator_rules() -> list[dict[str, Any]]:
    """The operator's RBAC source, as the chart reads it."""
    rules = yaml.safe_load(RULES_FILE.read_text())
    assert isinstance(rules, list) and rules, f"{RULES_FILE}: expected a non-empty list of PolicyRules"
    return rules


def env_of(deployment: dict[str, Any]) -> dict[str, str]:
    """The operator container's environment, with the pod's own fields filled in as the kubelet
    would (its namespace is the Deployment's)."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    fields = {"metadata.namespace": deployment["metadata"].get("namespace", ""), "metadata.name": "operator-pod"}

    def value(e: dict[str, Any]) -> str:
        ref = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        return str(fields.get(ref, "")) if ref else str(e.get("value", ""))

    return {e["name"]: value(e) for e in container.get("env", [])}

"""The chart's PrometheusRule and ServiceMonitor as the Prometheus Operator's own CRDs (pinned,
from its Go module: hack/cluster/binaries.py) see them: a strict server-side dry run on the local
API server admits them, and refuses a misspelt field, naming it."""

import copy
import subprocess
import time
from typing import Any

import pytest
import yaml

from hack.cluster import binaries
from tests.fixtures.cluster import Cluster
from tests.support.helm import ALL_ON_VALUES, render

pytestmark = pytest.mark.cluster

PLURALS = ("prometheusrules", "servicemonitors")


def _kubectl(cluster: Cluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    found = binaries.resolve("kubectl")
    assert found is not None, "kubectl is missing: `make cluster-up` builds it"
    return subprocess.run(
        [str(found), "--kubeconfig", str(cluster.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def monitoring_crds(cluster: Cluster) -> None:
    for plural in PLURALS:
        applied = _kubectl(cluster, "apply", "--server-side", "-f", str(binaries.prometheus_operator_crd(plural)))
        assert applied.returncode == 0, applied.stderr
        _wait_established(cluster, f"crd/{plural}.monitoring.coreos.com")


def _wait_established(cluster: Cluster, crd: str) -> None:
    """`kubectl wait` for Established, again while the CRD has no status yet: kubectl fails at
    once, not waiting, on a CRD whose `status.conditions` the server has not written (seen under
    load: "status.conditions accessor error: <nil>")."""
    deadline = time.monotonic() + 120
    while True:
        established = _kubectl(cluster, "wait", "--for=condition=Established", "--timeout=60s", crd)
        if established.returncode == 0:
            return
        assert time.monotonic() < deadline, established.stderr
        time.sleep(0.5)


def _dry_run(cluster: Cluster, objects: list[dict[str, Any]], namespace: str) -> subprocess.CompletedProcess[str]:
    return _kubectl(
        cluster,
        "apply",
        "--dry-run=server",
        "--validate=strict",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=yaml.safe_dump_all(objects),
    )


def test_the_prometheus_operators_crds_admit_the_rule_and_the_monitor(
    cluster: Cluster, monitoring_crds: None, namespace: str
) -> None:
    objects = [
        o for o in render([ALL_ON_VALUES], namespace=namespace) if o["kind"] in ("PrometheusRule", "ServiceMonitor")
    ]
    # The operator's ServiceMonitor and the servers' (llama-server's metrics).
    assert sorted(o["kind"] for o in objects) == ["PrometheusRule", "ServiceMonitor", "ServiceMonitor"]
    result = _dry_run(cluster, objects, namespace)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip().splitlines()) == 3


def test_a_misspelt_rule_field_is_refused_naming_it(cluster: Cluster, monitoring_crds: None, namespace: str) -> None:
    """The dry run can fail: `for` misspelt is an unknown field under strict validation."""
    (rule,) = [o for o in render([ALL_ON_VALUES], namespace=namespace) if o["kind"] == "PrometheusRule"]
    broken = copy.deepcopy(rule)
    first = broken["spec"]["groups"][0]["rules"][1]
    first["forr"] = first.pop("for")
    result = _dry_run(cluster, [broken], namespace)
    assert result.returncode != 0
    assert "forr" in result.stderr, result.stderr

"""The API server and etcd restarted under a running operator: it recovers, status converges.

Runs on a throwaway cluster of its own (hack.cluster with FINETUNE_CLUSTER_DIR), so restarting
its API server disturbs no other test. Figures, with jobs in flight across the restart, counted
from the API server answering again:
- converge_s: every job's status true (all Succeeded), the figure the target is about;
- children_s: every Job Complete, which needs kube-scheduler, the Job controller and KWOK to
  recover too; their watch backoff (client-go: up to 30 s, reset after 2 minutes of health)
  grows with restarts that come close together;
- operator_lag_s: converge_s - children_s, the part that is the operator's own.
"""

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from finetune_api import crd as crd_model
from hack.cluster import processes
from hack.cluster.control_plane import ClusterState, admin_ssl_context, http_ok
from hack.cluster.layout import REPO_ROOT, STATE_DIR_ENV, Layout
from hack.cluster.pki import Pki
from tests.reliability.cluster_kit import LOAD_SPEC
from tests.support.harness import NO_INPUT_CHECK, Jobs, OperatorProcess, wait_for

from .cluster_kit import add_gpu_nodes, has_default_sa, load_pvcs, our_identity

pytestmark = pytest.mark.cluster

RESULTS = REPO_ROOT / ".cache" / "reliability"


def _cluster_command(command: str, root: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hack.cluster", command],
        cwd=REPO_ROOT,
        env={**os.environ, STATE_DIR_ENV: str(root)},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, f"hack.cluster {command}: {result.stdout}{result.stderr}"


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[Layout]:
    root = tmp_path / "cluster"
    _cluster_command("up", root)
    try:
        yield Layout(root)
    finally:
        _cluster_command("down", root)


def _ready(layout: Layout) -> bool:
    state = ClusterState.load(layout.state)
    return http_ok(f"{state.server}/readyz", admin_ssl_context(Pki(layout.pki)))


def restart_apiserver_and_etcd(layout: Layout) -> float:
    """Stop kube-apiserver and etcd, start them again with the same command lines; seconds of outage."""
    argv: dict[str, list[str]] = {}
    for name in ("kube-apiserver", "etcd"):
        record = json.loads((layout.pids / f"{name}.json").read_text())
        argv[name] = [p.decode() for p in Path(f"/proc/{record['pid']}/cmdline").read_bytes().split(b"\0") if p]
    stopped = time.monotonic()
    processes.stop(layout, "kube-apiserver")
    processes.stop(layout, "etcd")
    processes.start(layout, "etcd", argv["etcd"])
    time.sleep(1)
    processes.start(layout, "kube-apiserver", argv["kube-apiserver"])
    wait_for(lambda: _ready(layout), 120, "the API server ready again", interval=0.2)
    return time.monotonic() - stopped


def scenario(layout: Layout, tmp_path: Path, jobs: int, restarts: int, gap_s: float = 0) -> dict[str, Any]:
    """`restarts` rounds of: submit `jobs`, restart, wait for convergence; rounds start at least
    `gap_s` apart (client-go resets its watch backoff after 2 minutes of health)."""
    configuration = client.Configuration()
    config.load_kube_config(str(layout.kubeconfig), client_configuration=configuration)
    api = client.ApiClient(configuration)
    client.ApiextensionsV1Api(api).create_custom_resource_definition(crd_model.crd())
    wait_for(lambda: _crd_ready(api), 60, "CRD established")
    core = client.CoreV1Api(api)
    namespace = "restart"
    core.create_namespace({"metadata": {"name": namespace}})
    wait_for(lambda: has_default_sa(core, namespace), 60, "default SA")
    load_pvcs(core, namespace)
    add_gpu_nodes(core, "restart", 4)
    kubeconfig = our_identity(api, layout.kubeconfig, tmp_path, "restart")
    operator = OperatorProcess(
        kubeconfig, namespace, tmp_path / "operator.log", env=NO_INPUT_CHECK | {"FINETUNE_LOG_LEVEL": "INFO"}
    )
    operator.start()
    ft = Jobs(api, namespace)
    batch = client.BatchV1Api(api)
    figures: list[dict[str, float]] = []
    try:
        created = 0
        back = time.monotonic()
        for round_ in range(restarts):
            if round_:
                time.sleep(max(0.0, gap_s - (time.monotonic() - back)))
            for _ in range(jobs):
                ft.create(f"job-{created:03d}", LOAD_SPEC)
                created += 1
            outage = restart_apiserver_and_etcd(layout)
            back = time.monotonic()
            names = [f"job-{i:03d}" for i in range(created)]
            settled: list[float] = []

            def converged(names: list[str] = names, settled: list[float] = settled) -> bool:
                if not settled and _jobs_complete(batch, namespace) >= len(names):
                    settled.append(time.monotonic())
                return all(ft.status(n).get("phase") == "Succeeded" for n in names)

            wait_for(converged, 300, "every job Succeeded after the restart", interval=0.5)
            done = time.monotonic()
            children = (settled[0] if settled else done) - back
            figures.append(
                {
                    "outage_s": round(outage, 1),
                    "children_s": round(children, 1),
                    "converge_s": round(done - back, 1),
                    "operator_lag_s": round(done - back - children, 1),
                }
            )
            assert operator.proc is not None and operator.proc.poll() is None, f"operator died:\n{operator.tail()}"
    finally:
        operator.stop()
    result = {
        "jobs_per_round": jobs,
        "restarts": restarts,
        "gap_s": gap_s,
        "rounds": figures,
        "max_converge_s": max(f["converge_s"] for f in figures),
        "max_children_s": max(f["children_s"] for f in figures),
        "max_operator_lag_s": max(f["operator_lag_s"] for f in figures),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"apiserver-restart-{restarts}-gap{gap_s:.0f}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return result


def _jobs_complete(batch: client.BatchV1Api, namespace: str) -> int:
    jobs = batch.list_namespaced_job(namespace).items
    return sum(1 for j in jobs if any(c.type == "Complete" and c.status == "True" for c in j.status.conditions or []))


def _crd_ready(api: client.ApiClient) -> bool:
    crd = client.ApiextensionsV1Api(api).read_custom_resource_definition("finetunejobs.finetune.dev")
    return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])


def test_apiserver_restart_converges(own_cluster: Layout, tmp_path: Path) -> None:
    result = scenario(own_cluster, tmp_path, jobs=5, restarts=1)
    assert result["max_converge_s"] < 60, result


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_apiserver_restarted_5_times(own_cluster: Layout, tmp_path: Path) -> None:
    # Restarts 150 s apart: each one meets components whose watch backoff has reset, as after
    # real, separate restarts. Back to back (gap 0) the scheduler's backoff alone reached 85 s.
    result = scenario(own_cluster, tmp_path, jobs=10, restarts=5, gap_s=150)
    assert result["max_converge_s"] < 60, result

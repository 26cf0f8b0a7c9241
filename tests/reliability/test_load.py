"""Load: many FineTuneJobs on many fake GPU nodes, our operator against a bare-kopf floor.

Both operators run in the same test, one after the other, on the same cluster and nodes, each
under a ServiceAccount of its own; the API server counts each one's requests (a FlowSchema per
account). Measured: CR-to-Job latency p50/p99 (from the create call to the Job's first sight
on a watch), peak RSS, API requests per job; every job must be placed and finish.
"""

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.fixtures.cluster import Cluster
from tests.operator.harness import Jobs, OperatorProcess, wait_for

from .cluster_kit import (
    FloorOperator,
    JobWatch,
    add_gpu_nodes,
    count_requests_of,
    dispatched,
    floor_identity,
    has_default_sa,
    load_pvcs,
    our_identity,
    peak_rss_mib,
    percentile,
    remove_nodes,
    running,
)

pytestmark = pytest.mark.cluster

RESULTS = Path(__file__).resolve().parents[2] / ".cache" / "reliability"

LOAD_SPEC: dict[str, Any] = {
    "model": {"source": {"pvc": {"claimName": "models", "path": "tiny"}}},
    "dataset": {"source": {"pvc": {"claimName": "datasets", "path": "a.jsonl"}}, "format": "alpaca"},
    "output": {"pvc": {"claimName": "outputs"}},
    "training": {"maxSteps": 10},
    "resources": {"gpus": 4, "gpuProduct": "Tesla-P40"},
    "backoffLimit": 0,
}


@dataclass
class LoadFigures:
    operator: str
    jobs: int
    jobs_created: int
    jobs_finished: int
    duplicates: int
    p50_s: float
    p99_s: float
    max_s: float
    peak_rss_mib: float
    requests: int
    requests_per_job: float
    wall_s: float


def _namespace(core: client.CoreV1Api, name: str) -> str:
    core.create_namespace({"metadata": {"name": name, "labels": {"finetune.dev/test": "true"}}})
    wait_for(lambda: has_default_sa(core, name), 30, "default SA")
    load_pvcs(core, name)
    return name


def _finished_jobs(batch: client.BatchV1Api, namespace: str) -> int:
    done = 0
    for job in batch.list_namespaced_job(namespace).items:
        if any(c.type in ("Complete", "Failed") and c.status == "True" for c in job.status.conditions or []):
            done += 1
    return done


def run_load(
    kube: client.ApiClient,
    namespace: str,
    operator: OperatorProcess | FloorOperator,
    label: str,
    account: str,
    jobs: int,
    timeout: float,
) -> LoadFigures:
    core = client.CoreV1Api(kube)
    batch = client.BatchV1Api(kube)
    flow = count_requests_of(kube, account)
    custom = Jobs(kube, namespace)
    with running(operator), JobWatch(kube, namespace) as seen:
        before = dispatched(kube, flow)
        started = time.monotonic()
        submitted: dict[str, float] = {}
        for index in range(jobs):
            name = f"load-{index:04d}"
            submitted[name] = time.monotonic()
            custom.create(name, LOAD_SPEC)
        wait_for(lambda: len(seen.seen) >= jobs, timeout, f"{jobs} Jobs from {label} (have {len(seen.seen)})", 1)
        wait_for(
            lambda: _finished_jobs(batch, namespace) >= jobs,
            timeout,
            f"{jobs} Jobs finished under {label} (done {_finished_jobs(batch, namespace)})",
            interval=2,
        )
        if label == "ours":
            wait_for(
                lambda: all(custom.status(n).get("phase") == "Succeeded" for n in submitted),
                timeout,
                "every FineTuneJob Succeeded",
                interval=2,
            )
        wall = time.monotonic() - started
        requests = dispatched(kube, flow) - before
        pid = operator.proc.pid if operator.proc else 0
        rss = peak_rss_mib(pid)
        latencies = [seen.seen[n] - t for n, t in submitted.items() if n in seen.seen]
        return LoadFigures(
            operator=label,
            jobs=jobs,
            jobs_created=len(seen.seen),
            jobs_finished=_finished_jobs(batch, namespace),
            duplicates=len(seen.created_twice),
            p50_s=round(percentile(latencies, 0.50), 3),
            p99_s=round(percentile(latencies, 0.99), 3),
            max_s=round(max(latencies), 3),
            peak_rss_mib=round(rss, 1),
            requests=requests,
            requests_per_job=round(requests / jobs, 2),
            wall_s=round(wall, 1),
        )
    del core


def compare(cluster: Cluster, kube: client.ApiClient, tmp_path: Path, jobs: int, nodes: int) -> dict[str, Any]:
    core = client.CoreV1Api(kube)
    stamp = time.strftime("%H%M%S")
    added = add_gpu_nodes(core, f"load-{stamp}", nodes)
    namespaces: list[str] = []
    try:
        floor_ns = _namespace(core, f"load-floor-{stamp}")
        ours_ns = _namespace(core, f"load-ours-{stamp}")
        namespaces += [floor_ns, ours_ns]
        floor_config = floor_identity(kube, cluster.kubeconfig, tmp_path)
        ours_config = our_identity(kube, cluster.kubeconfig, tmp_path)
        timeout = 120 + jobs * 2.0
        # Unmeasured warm-up on the same nodes, so the floor (measured first) does not pay
        # for a just-started control plane and just-registered nodes that ours never sees.
        warm_ns = _namespace(core, f"load-warm-{stamp}")
        namespaces.append(warm_ns)
        warm = max(10, jobs // 10)
        warm_floor = FloorOperator(floor_config, warm_ns, tmp_path / "warm.log")
        run_load(kube, warm_ns, warm_floor, "floor", "floor", warm, timeout)
        floor = run_load(
            kube,
            floor_ns,
            FloorOperator(floor_config, floor_ns, tmp_path / "floor.log"),
            "floor",
            "floor",
            jobs,
            timeout,
        )
        ours_proc = OperatorProcess(
            ours_config,
            ours_ns,
            tmp_path / "ours.log",
            env={"FINETUNE_LOG_LEVEL": "INFO", "FINETUNE_RESYNC_SECONDS": "30"},
        )
        ours = run_load(kube, ours_ns, ours_proc, "ours", "ours", jobs, timeout)
    finally:
        for name in namespaces:
            core.delete_namespace(name, propagation_policy="Background")
        remove_nodes(core, added)
    result = {
        "floor": asdict(floor),
        "ours": asdict(ours),
        "latency_p99_ratio": round(ours.p99_s / floor.p99_s, 2) if floor.p99_s else None,
        "latency_p50_ratio": round(ours.p50_s / floor.p50_s, 2) if floor.p50_s else None,
        "rss_ratio": round(ours.peak_rss_mib / floor.peak_rss_mib, 2),
        "requests_ratio": round(ours.requests_per_job / floor.requests_per_job, 2) if floor.requests_per_job else None,
        "nodes": nodes,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"load-{jobs}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return result


def check_accounted(result: dict[str, Any], jobs: int) -> None:
    """Nothing lost, nothing doubled: every job got exactly one Job and finished, under both operators."""
    for figures in (result["ours"], result["floor"]):
        assert figures["jobs_created"] == jobs, figures
        assert figures["jobs_finished"] == jobs, figures
        assert figures["duplicates"] == 0, figures


def check_targets(result: dict[str, Any], p99_limit: float) -> None:
    """The issue's speed and memory targets; asserted by the soak run, whose figures the README reports."""
    ours = result["ours"]
    assert ours["p99_s"] < p99_limit, f"p99 CR-to-Job {ours['p99_s']}s over {p99_limit}s"
    assert result["rss_ratio"] <= 1.5, f"peak RSS {result['rss_ratio']}x the floor"


def test_load_short(cluster: Cluster, kube: client.ApiClient, tmp_path: Path) -> None:
    jobs = int(os.environ.get("FINETUNE_LOAD_JOBS_SHORT", "30"))
    result = compare(cluster, kube, tmp_path, jobs=jobs, nodes=8)
    # The short run proves accounting; latency on a shared 2-core CI box is recorded in
    # .cache/reliability/ but judged only by the soak run below.
    check_accounted(result, jobs)


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_load_500_jobs_on_50_nodes(cluster: Cluster, kube: client.ApiClient, tmp_path: Path) -> None:
    result = compare(cluster, kube, tmp_path, jobs=500, nodes=50)
    check_accounted(result, 500)
    check_targets(result, p99_limit=2.0)
    for ratio in ("latency_p50_ratio", "latency_p99_ratio"):
        assert result[ratio] is not None and result[ratio] <= 1.5, result

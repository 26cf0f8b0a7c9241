"""CR-create-to-Job-create latency and operator memory with many jobs on fake GPU nodes.

Run against a running local control plane (`make cluster-up`):

    .venv/bin/python -m bench.operator_latency --jobs 200

It starts the operator under its own ServiceAccount (the chart's RBAC rules) watching a fresh
namespace, creates N single-GPU FineTuneJobs on the KWOK P40 nodes as fast as the client can,
times each from the create call's return to the moment its Job appears on a watch, and reads
the operator's RSS from /proc while the jobs run and after they settle. Prints one JSON object.
"""

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from finetune_api.constants import LABEL_JOB
from hack.cluster.layout import Layout
from tests.support.harness import Jobs, OperatorProcess, operator_identity, wait_for
from tests.support.install import finetune_crd_install, make_claim
from tests.support.specs import body


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))
    return ordered[index]


def spec() -> dict[str, Any]:
    return body(
        model={"source": {"hub": {"id": "org/tiny"}}},
        dataset={"source": {"hub": {"id": "org/data"}}, "format": "alpaca"},
        output={"pvc": {"claimName": "shared-outputs"}},
        resources={"gpus": 1, "gpuProduct": "Tesla-P40", "cpu": "1", "memory": "1Gi"},
    )


def watch_jobs(api: Any, namespace: str, seen: dict[str, float], stop: threading.Event) -> None:
    """When each Job first appears (monotonic seconds), until `stop`."""
    batch = client.BatchV1Api(api)
    w = watch.Watch()
    while not stop.is_set():
        for event in w.stream(batch.list_namespaced_job, namespace, label_selector=LABEL_JOB, timeout_seconds=5):
            seen.setdefault(event["object"].metadata.name, time.monotonic())


def phases_of(api: Any, namespace: str) -> dict[str, int]:
    """FineTuneJobs per status phase."""
    phases: dict[str, int] = {}
    for item in client.CustomObjectsApi(api).list_namespaced_custom_object(
        "finetune.dev", "v1alpha1", namespace, "finetunejobs"
    )["items"]:
        phase = (item.get("status") or {}).get("phase") or "None"
        phases[phase] = phases.get(phase, 0) + 1
    return phases


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.operator_latency")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--settle", type=float, default=60, help="seconds to let jobs run before the last RSS reading")
    parser.add_argument("--keep", action="store_true", help="keep the namespace afterwards")
    args = parser.parse_args()

    kubeconfig = Layout.for_repo().kubeconfig
    configuration = client.Configuration()
    config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    api = client.ApiClient(configuration)
    core = client.CoreV1Api(api)
    finetune_crd_install(api)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    make_claim(core, namespace, "shared-outputs")
    folder = Path(tempfile.mkdtemp(prefix="ftj-bench-"))
    operator = OperatorProcess(operator_identity(api, kubeconfig, folder), namespace, folder / "operator.log")
    operator.extra_env = {"FINETUNE_LOG_LEVEL": "INFO", "FINETUNE_RESYNC_SECONDS": "30"}
    operator.start()
    assert operator.proc is not None
    rss_idle = rss_mib(operator.proc.pid)

    seen: dict[str, float] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch_jobs, args=(api, namespace, seen, stop), daemon=True)
    watcher.start()
    time.sleep(1)

    jobs = Jobs(api, namespace)
    created: dict[str, float] = {}
    started = time.monotonic()
    for i in range(args.jobs):
        name = f"bench-{i:04d}"
        jobs.create(name, spec())
        created[name] = time.monotonic()
    create_seconds = time.monotonic() - started
    wait_for(lambda: len(seen) >= args.jobs, 600, f"{args.jobs} Jobs (seen {len(seen)})", interval=1)
    all_jobs_seconds = time.monotonic() - started
    rss_after_create = rss_mib(operator.proc.pid)
    time.sleep(args.settle)
    rss_settled = rss_mib(operator.proc.pid)
    stop.set()
    reconcile = {
        line.split()[0]: float(line.split()[1])
        for line in operator.metrics().splitlines()
        if line.startswith(("finetune_reconcile_seconds_sum", "finetune_reconcile_seconds_count"))
    }

    latencies = [seen[n] - created[n] for n in created]
    phases = phases_of(api, namespace)
    result = {
        "jobs": args.jobs,
        "create_calls_seconds": round(create_seconds, 2),
        "all_jobs_created_seconds": round(all_jobs_seconds, 2),
        "latency_p50_seconds": round(statistics.median(latencies), 3),
        "latency_p99_seconds": round(percentile(latencies, 99), 3),
        "latency_max_seconds": round(max(latencies), 3),
        "operator_rss_mib": {
            "idle": round(rss_idle, 1),
            "after_create": round(rss_after_create, 1),
            "settled": round(rss_settled, 1),
        },
        "phases_after_settle": phases,
        "api_create_call_mean_seconds": round(create_seconds / args.jobs, 3),
        "reconciles": int(reconcile.get("finetune_reconcile_seconds_count", 0)),
        "reconcile_mean_seconds": round(
            reconcile.get("finetune_reconcile_seconds_sum", 0)
            / max(reconcile.get("finetune_reconcile_seconds_count", 1), 1),
            3,
        ),
    }
    operator.stop()
    if not args.keep:
        core.delete_namespace(namespace)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Load: many FineTuneJobs on many fake GPU nodes, our operator against a bare-kopf floor.

Both operators run in the same test, one after the other (in rounds, see `compare`), on the
same cluster and nodes, each under a ServiceAccount of its own; the API server counts each
one's requests (a FlowSchema per account). Ours runs as the chart runs it, with leader election
(alone on its Lease, whose renewals count among its requests) and the chart's defaults.
Measured: CR-to-Job latency p50/p99 (from the create call to the Job's first sight on a watch),
peak RSS, API requests per job; every job must be placed and finish.
"""

import concurrent.futures
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from finetune_api.constants import GROUP, PLURAL, VERSION
from finetune_api.contract import TERMINAL_PHASES
from tests.fixtures.cluster import Cluster
from tests.support.harness import NO_INPUT_CHECK, Jobs, OperatorProcess, wait_for

from .cluster_kit import (
    LOAD_SPEC,
    FloorOperator,
    JobWatch,
    PhaseWatch,
    add_gpu_nodes,
    count_requests_of,
    cpu_seconds,
    dispatched,
    floor_identity,
    forget_lease,
    has_default_sa,
    leader_env,
    load_pvcs,
    machine,
    our_identity,
    peak_rss_mib,
    percentile,
    remove_nodes,
    running,
)

pytestmark = pytest.mark.cluster

RESULTS = Path(__file__).resolve().parents[2] / ".cache" / "reliability"


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
    # Diagnostics, not targets: what the operator burned, and how long the test's own creates
    # took (the API server's load shows there first).
    burst_cpu_s: float  # until the last Job was seen
    cpu_s: float  # until every job finished
    submit_s: float
    requests: int
    requests_per_job: float
    wall_s: float
    # Ours only: its own count of what it asked the API server, per "verb kind" and job
    # (finetune_api_requests_total; its watches are not in it, the API server's count above is).
    requests_per_job_by_kind: dict[str, float] = field(default_factory=dict)


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


def _succeeded(kube: client.ApiClient, namespace: str) -> int:
    """FineTuneJobs of the namespace whose status says Succeeded (one list, not a get per job)."""
    listed = client.CustomObjectsApi(kube).list_namespaced_custom_object(
        "finetune.dev", "v1alpha1", namespace, "finetunejobs"
    )["items"]
    return sum(1 for o in listed if (o.get("status") or {}).get("phase") == "Succeeded")


def run_load(
    kube: client.ApiClient,
    namespace: str,
    operator: OperatorProcess | FloorOperator,
    label: str,  # "ours" or "floor": also the name of the operator's ServiceAccount
    jobs: int,
    timeout: float,
) -> LoadFigures:
    batch = client.BatchV1Api(kube)
    flow = count_requests_of(kube, label)
    custom = Jobs(kube, namespace)
    with running(operator), JobWatch(kube, namespace) as seen:
        before = dispatched(kube, flow)
        started = time.monotonic()
        submitted: dict[str, float] = {}
        for index in range(jobs):
            name = f"load-{index:04d}"
            submitted[name] = time.monotonic()
            custom.create(name, LOAD_SPEC)
        submit = time.monotonic() - started
        wait_for(lambda: len(seen.seen) >= jobs, timeout, f"{jobs} Jobs from {label} (have {len(seen.seen)})", 1)
        pid = operator.proc.pid if operator.proc else 0
        burst_cpu = cpu_seconds(pid)
        wait_for(
            lambda: _finished_jobs(batch, namespace) >= jobs,
            timeout,
            f"{jobs} Jobs finished under {label} (done {_finished_jobs(batch, namespace)})",
            interval=2,
        )
        if label == "ours":
            wait_for(
                lambda: _succeeded(kube, namespace) >= jobs,
                timeout,
                "every FineTuneJob Succeeded",
                interval=2,
            )
        wall = time.monotonic() - started
        requests = dispatched(kube, flow) - before
        by_kind = own_requests(operator) if isinstance(operator, OperatorProcess) else {}
        rss = peak_rss_mib(pid)
        cpu = cpu_seconds(pid)
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
            burst_cpu_s=round(burst_cpu, 1),
            cpu_s=round(cpu, 1),
            submit_s=round(submit, 1),
            requests=requests,
            requests_per_job=round(requests / jobs, 2),
            wall_s=round(wall, 1),
            requests_per_job_by_kind={k: round(v / jobs, 2) for k, v in sorted(by_kind.items())},
        )


def own_requests(operator: OperatorProcess) -> dict[str, float]:
    """The operator's finetune_api_requests_total, as {"verb kind": count}."""
    return operator.requests()


RATIOS = {  # ratio to the floor -> the figure it divides
    "latency_p50_ratio": "p50_s",
    "latency_p99_ratio": "p99_s",
    "rss_ratio": "peak_rss_mib",
    "requests_ratio": "requests_per_job",
}


def _ratios(ours: LoadFigures, floor: LoadFigures) -> dict[str, float | None]:
    ratios: dict[str, float | None] = {}
    for key, figure in RATIOS.items():
        below = getattr(floor, figure)
        ratios[key] = round(getattr(ours, figure) / below, 2) if below else None
    return ratios


def _delete_namespaces(core: client.CoreV1Api, names: list[str], timeout: float) -> None:
    """Delete the namespaces and wait until they are gone, so the next round starts from the same state."""
    for name in names:
        core.delete_namespace(name, propagation_policy="Background")

    def gone() -> bool:
        return not {ns.metadata.name for ns in core.list_namespace().items} & set(names)

    wait_for(gone, timeout, f"namespaces {names} deleted", 2)


def compare(
    cluster: Cluster, kube: client.ApiClient, tmp_path: Path, jobs: int, nodes: int, rounds: int = 1
) -> dict[str, Any]:
    """Floor and ours, `rounds` times on the same nodes, in alternating order (floor first in odd rounds).

    One ratio from one burst each is at the mercy of whatever else the two shared cores do in
    that half minute (an etcd snapshot, a collection, the machine's neighbours): on one commit
    the p99 ratio of single runs went from 0.88 to 2.42. So the soak measures several rounds,
    alternating which operator goes first against drift, and judges each ratio's median; the
    JSON keeps every round.
    """
    core = client.CoreV1Api(kube)
    stamp = time.strftime("%H%M%S")
    machine_before = machine()
    added = add_gpu_nodes(core, f"load-{stamp}", nodes)
    per_round: list[dict[str, Any]] = []
    try:
        floor_config = floor_identity(kube, cluster.kubeconfig, tmp_path)
        ours_config = our_identity(kube, cluster.kubeconfig, tmp_path)
        forget_lease(kube, "ours")
        timeout = 120 + jobs * 2.0
        # Unmeasured warm-up on the same nodes, so the first operator measured does not pay
        # for a just-started control plane and just-registered nodes that the other never sees.
        warm_ns = _namespace(core, f"load-warm-{stamp}")
        warm = FloorOperator(floor_config, warm_ns, tmp_path / "warm.log")
        run_load(kube, warm_ns, warm, "floor", max(10, jobs // 10), timeout)
        _delete_namespaces(core, [warm_ns], timeout)
        for index in range(rounds):
            floor_ns = _namespace(core, f"load-floor-{stamp}-{index}")
            ours_ns = _namespace(core, f"load-ours-{stamp}-{index}")
            floor_op = FloorOperator(floor_config, floor_ns, tmp_path / f"floor-{index}.log")
            ours_op = OperatorProcess(
                ours_config,
                ours_ns,
                tmp_path / f"ours-{index}.log",
                env=NO_INPUT_CHECK
                | leader_env("ours")
                | {"FINETUNE_LOG_LEVEL": "INFO", "FINETUNE_RESYNC_SECONDS": "30"},
            )
            runs = [(floor_ns, floor_op, "floor"), (ours_ns, ours_op, "ours")]
            figures: dict[str, LoadFigures] = {}
            for namespace, operator, label in runs if index % 2 == 0 else runs[::-1]:
                figures[label] = run_load(kube, namespace, operator, label, jobs, timeout)
            ours, floor = figures["ours"], figures["floor"]
            per_round.append({"floor": asdict(floor), "ours": asdict(ours), **_ratios(ours, floor)})
            _delete_namespaces(core, [floor_ns, ours_ns], timeout)
    finally:
        for ns in core.list_namespace().items:  # what a failed round left behind
            ours_left = ns.metadata.name.startswith("load-") and f"-{stamp}" in ns.metadata.name
            if ours_left and ns.status.phase != "Terminating":
                core.delete_namespace(ns.metadata.name, propagation_policy="Background")
        remove_nodes(core, added)
    result: dict[str, Any] = {"jobs": jobs, "nodes": nodes, "machine": machine(machine_before), "rounds": per_round}
    for key in RATIOS:
        values = [r[key] for r in per_round if r[key] is not None]
        result[key] = round(statistics.median(values), 2) if values else None
    # Ours' median p99 against the floor's median round: one ratio of two medians, so a single
    # slow round of either operator does not decide it.
    floor_p99 = statistics.median(r["floor"]["p99_s"] for r in per_round)
    ours_p99 = statistics.median(r["ours"]["p99_s"] for r in per_round)
    result["p99_to_floor_median"] = round(ours_p99 / floor_p99, 2) if floor_p99 else None
    result["requests_per_job_max"] = max(r["ours"]["requests_per_job"] for r in per_round)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"load-{jobs}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return result


def check_accounted(result: dict[str, Any], jobs: int) -> None:
    """Nothing lost, nothing doubled: every job got exactly one Job and finished, under both operators, every round."""
    for round_ in result["rounds"]:
        for figures in (round_["ours"], round_["floor"]):
            assert figures["jobs_created"] == jobs, figures
            assert figures["jobs_finished"] == jobs, figures
            assert figures["duplicates"] == 0, figures


def check_targets(result: dict[str, Any], p99_limit: float) -> None:
    """The issues' targets, asserted by the soak run whose figures the README reports: the absolute
    p99 in every round, the ratios to the floor on their median over the rounds; at most 4 API
    requests per job over its whole life in every round, and ours' median p99 at most the
    floor's median round's (#43)."""
    for round_ in result["rounds"]:
        p99 = round_["ours"]["p99_s"]
        assert p99 < p99_limit, f"p99 CR-to-Job {p99}s over {p99_limit}s"
        assert round_["ours"]["requests_per_job"] <= 4.0, f"over 4 requests per job: {round_['ours']}"
    for key in ("rss_ratio", "latency_p50_ratio", "latency_p99_ratio"):
        assert result[key] is not None and result[key] <= 1.5, f"{key} {result[key]} over 1.5: {result}"
    assert result["p99_to_floor_median"] <= 1.0, f"p99 {result['p99_to_floor_median']}x the floor's: {result}"


def test_load_short(cluster: Cluster, kube: client.ApiClient, tmp_path: Path) -> None:
    jobs = int(os.environ.get("FINETUNE_LOAD_JOBS_SHORT", "30"))
    result = compare(cluster, kube, tmp_path, jobs=jobs, nodes=8)
    # The short run proves accounting; latency on a shared 2-core CI box is recorded in
    # .cache/reliability/ but judged only by the soak run below.
    check_accounted(result, jobs)


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_load_500_jobs_on_50_nodes(cluster: Cluster, kube: client.ApiClient, tmp_path: Path) -> None:
    result = compare(cluster, kube, tmp_path, jobs=500, nodes=50, rounds=3)
    check_accounted(result, 500)
    check_targets(result, p99_limit=2.0)


# --- the fleet: 5,000 jobs on 200 nodes, then a restart that resyncs all of them --------------


def _metric_sum(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith((f"{name} ", f"{name}{{"))
    )


def resync_after_restart(
    kube: client.ApiClient, config: Path, namespace: str, log: Path, jobs: int, timeout: float
) -> dict[str, Any]:
    """A fresh operator over `jobs` finished FineTuneJobs: how long until it leads, has listed
    everything and reconciled every job once (its phase gauge counts them all, its queue is
    empty), what that cost in requests, memory and CPU. Nothing should be written: every status
    is already true."""
    flow = count_requests_of(kube, "ours")
    before = dispatched(kube, flow)
    operator = OperatorProcess(
        config, namespace, log, env=NO_INPUT_CHECK | leader_env("ours") | {"FINETUNE_LOG_LEVEL": "INFO"}
    )
    started = time.monotonic()
    with running(operator):
        ready = time.monotonic() - started

        slow_scrapes = 0

        def settled() -> bool:
            nonlocal slow_scrapes
            try:
                text = operator.metrics()
            except OSError:
                # Not an answer yet: at 5,000 jobs the first run's restart took the operator past
                # the scrape's 5 s while it took in the listing, and the test stopped there.
                # Counted in the record: a Prometheus scrape would have missed it too.
                slow_scrapes += 1
                return False
            return _metric_sum(text, "finetune_jobs") >= jobs and _metric_sum(text, "finetune_workqueue_depth") == 0

        # Each scrape builds every job's series from the cache (job_metrics.py): at 5,000 jobs
        # that is CPU the resync itself wants, so the test asks every 2 s, as a scraper would
        # at most, not every half second.
        wait_for(settled, timeout, f"{jobs} jobs reconciled after the restart", RESYNC_POLL_S)
        resynced = time.monotonic() - started
        assert operator.proc is not None
        pid = operator.proc.pid
        own = own_requests(operator)
        figures = {
            "jobs": jobs,
            "process_ready_s": round(ready, 1),
            "all_reconciled_s": round(resynced, 1),
            "peak_rss_mib": round(peak_rss_mib(pid), 1),
            "cpu_s": round(cpu_seconds(pid), 1),
            "requests": dispatched(kube, flow) - before,
            "own_requests_by_kind": own,
            "status_writes": own.get("patch FineTuneJob/status", 0),
            "metrics_scrapes_over_5s": slow_scrapes,
        }
    return figures


RESYNC_POLL_S = 2.0


# The test's own creates, this many at a time. One at a time, 5,000 creates took the shared
# 2-core machine about 20 minutes: Jobs were being created that whole time, so the operator paced
# its status writes (runtime/pacing.py) for all of it, and the soak measured the test's submitter
# more than the operator. A fleet's users submit side by side.
SUBMITTERS = 8
PROGRESS_S = 30.0


@dataclass
class FleetFigures:
    jobs: int
    submitted: int
    jobs_created: int  # Jobs seen on the watch, one per FineTuneJob
    jobs_finished: int  # Jobs Complete or Failed, from one list at the end
    duplicates: int
    terminal: int  # FineTuneJobs whose status phase is Succeeded or Failed, from one list at the end
    succeeded: int
    completed: bool  # every job terminal within the timeout
    submit_s: float
    all_created_s: float | None  # from the first create to the last Job's first sight
    all_terminal_s: float | None  # ... to the last FineTuneJob's terminal phase
    p50_s: float  # CR-to-Job, for the record: the 500-job load judges it against the floor
    p99_s: float
    peak_rss_mib: float
    cpu_s: float
    requests: int
    requests_per_job: float
    requests_per_job_by_kind: dict[str, float] = field(default_factory=dict)
    # Every PROGRESS_S: seconds since the first create, FineTuneJobs submitted, Jobs seen, Jobs
    # finished, FineTuneJobs terminal, the operator's CPU seconds and RSS (MiB) so far, and the
    # machine's one-minute load average (two cores, shared).
    progress: list[dict[str, float]] = field(default_factory=list)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_fleet(
    kube: client.ApiClient, namespace: str, operator: OperatorProcess, jobs: int, timeout: float
) -> FleetFigures:
    """Submit `jobs` FineTuneJobs, SUBMITTERS at a time, and wait until every one is terminal;
    progress comes from watches (a list of thousands every few seconds would load the API
    server more than the operator does), the end counts from one list each."""
    batch = client.BatchV1Api(kube)
    flow = count_requests_of(kube, "ours")
    custom = Jobs(kube, namespace)
    names = [f"fleet-{index:04d}" for index in range(jobs)]
    submitted: dict[str, float] = {}
    failures: list[str] = []

    def submit(name: str) -> None:
        submitted[name] = time.monotonic()
        try:
            custom.create(name, LOAD_SPEC)
        except Exception as exc:  # counted and reported: a lost submission is a finding, not a crash
            failures.append(f"{name}: {exc}")

    with running(operator), JobWatch(kube, namespace) as seen, PhaseWatch(kube, namespace) as phases:
        assert operator.proc is not None
        pid = operator.proc.pid
        before = dispatched(kube, flow)
        started = time.monotonic()
        pool = concurrent.futures.ThreadPoolExecutor(SUBMITTERS)
        submissions = [pool.submit(submit, name) for name in names]
        pool.shutdown(wait=False)
        submit_s: float | None = None
        all_created: float | None = None
        all_terminal: float | None = None
        progress: list[dict[str, float]] = []
        next_sample = started
        while time.monotonic() - started < timeout:
            now = time.monotonic()
            if submit_s is None and all(f.done() for f in submissions):
                submit_s = now - started
            if all_created is None and len(seen.seen) >= jobs:
                all_created = now - started
            terminal = phases.count(*TERMINAL_PHASES)
            if now >= next_sample or terminal >= jobs:
                progress.append(
                    {
                        "s": round(now - started, 1),
                        "submitted": len(submitted),
                        "jobs_seen": len(seen.seen),
                        "jobs_finished": len(seen.finished),
                        "terminal": terminal,
                        "cpu_s": round(cpu_seconds(pid), 1),
                        "rss_mib": round(_rss_mib(pid), 1),
                        "load_1m": round(os.getloadavg()[0], 2),
                    }
                )
                print(f"fleet: {progress[-1]}", flush=True)
                next_sample += PROGRESS_S
            if terminal >= jobs:
                all_terminal = now - started
                break
            time.sleep(2)
        for future in submissions:
            future.cancel()
        requests = dispatched(kube, flow) - before
        by_kind = own_requests(operator)
        rss = peak_rss_mib(pid)
        cpu = cpu_seconds(pid)
        listed = client.CustomObjectsApi(kube).list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        final = [(o.get("status") or {}).get("phase") for o in listed["items"]]
        latencies = [seen.seen[n] - t for n, t in list(submitted.items()) if n in seen.seen]
        figures = FleetFigures(
            jobs=jobs,
            submitted=len(submitted) - len(failures),
            jobs_created=len(seen.seen),
            jobs_finished=_finished_jobs(batch, namespace),
            duplicates=len(seen.created_twice),
            terminal=sum(1 for phase in final if phase in TERMINAL_PHASES),
            succeeded=sum(1 for phase in final if phase == "Succeeded"),
            completed=all_terminal is not None,
            submit_s=round(submit_s if submit_s is not None else time.monotonic() - started, 1),
            all_created_s=None if all_created is None else round(all_created, 1),
            all_terminal_s=None if all_terminal is None else round(all_terminal, 1),
            p50_s=round(percentile(latencies, 0.50), 3),
            p99_s=round(percentile(latencies, 0.99), 3),
            peak_rss_mib=round(rss, 1),
            cpu_s=round(cpu, 1),
            requests=requests,
            requests_per_job=round(requests / jobs, 2),
            requests_per_job_by_kind={k: round(v / jobs, 2) for k, v in sorted(by_kind.items())},
            progress=progress,
        )
    assert not failures, failures[:5]
    return figures


def fleet(cluster: Cluster, kube: client.ApiClient, tmp_path: Path, jobs: int, nodes: int) -> dict[str, Any]:
    """`jobs` submitted at once and run to the end by ours (leader election, the chart's
    settings), then a fresh operator's resync of them all; the JSON is written whether or not
    the run finished, so a run out of time still leaves its figures."""
    core = client.CoreV1Api(kube)
    stamp = time.strftime("%H%M%S")
    added = add_gpu_nodes(core, f"fleet-{stamp}", nodes)
    namespace = ""
    result: dict[str, Any] = {"jobs": jobs, "nodes": nodes, "submitters": SUBMITTERS}
    machine_before = machine()
    try:
        config = our_identity(kube, cluster.kubeconfig, tmp_path)
        forget_lease(kube, "ours")
        namespace = _namespace(core, f"fleet-{stamp}")
        operator = OperatorProcess(
            config,
            namespace,
            tmp_path / "fleet.log",
            env=NO_INPUT_CHECK | leader_env("ours") | {"FINETUNE_LOG_LEVEL": "INFO", "FINETUNE_RESYNC_SECONDS": "30"},
        )
        run = run_fleet(kube, namespace, operator, jobs, timeout=FLEET_TIMEOUT_S)
        result["run"] = asdict(run)
        if run.completed:
            result["restart"] = resync_after_restart(kube, config, namespace, tmp_path / "fleet-restart.log", jobs, 600)
    finally:
        if namespace:
            core.delete_namespace(namespace, propagation_policy="Background")
        remove_nodes(core, added)
        result["machine"] = machine(machine_before)
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"fleet-{jobs}.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
    return result


# How long the run may take before it counts as unfinished: on the shared 2-core machine the
# control plane's own Job controller and scheduler, not the operator, set the pace.
FLEET_TIMEOUT_S = float(os.environ.get("FINETUNE_FLEET_TIMEOUT_S", "3000"))


@pytest.mark.soak
@pytest.mark.timeout(7200)
def test_fleet_5000_jobs_on_200_nodes(cluster: Cluster, kube: client.ApiClient, tmp_path: Path) -> None:
    result = fleet(cluster, kube, tmp_path, jobs=5000, nodes=200)
    run = result["run"]
    assert run["completed"], {k: v for k, v in run.items() if k != "progress"}
    assert run["jobs_created"] == 5000 and run["jobs_finished"] == 5000 and run["terminal"] == 5000, run
    assert run["duplicates"] == 0, run
    restart = result["restart"]
    # The restart's resync is bounded: every job reconciled within 5 minutes, and none rewritten.
    assert restart["all_reconciled_s"] < 300, restart
    assert restart["status_writes"] == 0, restart

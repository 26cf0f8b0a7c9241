"""Two operator replicas, one leader: `python -m finetune_operator --leader-elect` twice, each under
a ServiceAccount of its own (so the API server counts each one's requests), on one Lease.

Proven (the fast test, in `make test`): exactly one of the two leads (its metric says 1, the
other's 0, and the Lease names it); the standby makes no write at all while the leader creates
Jobs and writes their status (its writes, every kind but the Lease, counted by a FlowSchema of
its own: 0); the leader SIGKILLed, the standby holds the Lease and leads within the lease
duration + 5 s, then reconciles: the jobs submitted before and after the kill each get one Job
and end Succeeded.

The soak (`make soak`): the leader SIGKILLed every 10-30 s, 20 times, during a 500-job burst
(a killed replica comes back as a fresh standby, as its Deployment would start it again): each
takeover within the lease duration + 5 s, 0 duplicate Jobs, 0 stuck, every job terminal. Its
record goes to .cache/reliability/leader-chaos-500x20.json.
"""

import contextlib
import json
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.fixtures.cluster import Cluster
from tests.support.harness import NO_INPUT_CHECK, Jobs, OperatorProcess, leader_role, operator_rules, wait_for

from .cluster_kit import (
    IDENTITY_NAMESPACE,
    LOAD_SPEC,
    JobWatch,
    add_gpu_nodes,
    count_requests_of,
    count_writes_of,
    dispatched,
    has_default_sa,
    identity,
    load_pvcs,
    remove_nodes,
)

pytestmark = pytest.mark.cluster

RESULTS = Path(__file__).resolve().parents[2] / ".cache" / "reliability"
LEASE = "reliability-leader"
TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Timings:
    duration_s: float
    renew_s: float
    retry_s: float

    def env(self) -> dict[str, str]:
        return {
            "FINETUNE_LEASE_DURATION_SECONDS": str(self.duration_s),
            "FINETUNE_LEASE_RENEW_DEADLINE_SECONDS": str(self.renew_s),
            "FINETUNE_LEASE_RETRY_PERIOD_SECONDS": str(self.retry_s),
        }


# Short, for `make test`; the soak runs the chart's defaults (values.yaml leaderElection).
FAST = Timings(6.0, 4.0, 1.0)
CHART_DEFAULTS = Timings(15.0, 10.0, 2.0)


class Replica:
    """One operator process of the pair: its account, its request counters, its process."""

    def __init__(self, kube: client.ApiClient, cluster: Cluster, folder: Path, account: str, namespace: str) -> None:
        self.kube = kube
        self.account = account
        self.kubeconfig = identity(kube, cluster.kubeconfig, folder, account, operator_rules())
        leader_role(kube, IDENTITY_NAMESPACE, account, LEASE)
        self.writes_flow = count_writes_of(kube, account)
        self.other_flow = count_requests_of(kube, account)
        self.folder = folder
        self.namespace = namespace
        self.proc: OperatorProcess | None = None
        self.starts = 0

    def start(self, timings: Timings) -> "Replica":
        self.starts += 1
        env = {
            **NO_INPUT_CHECK,
            **timings.env(),
            "FINETUNE_LOG_LEVEL": "INFO",
            "FINETUNE_RESYNC_SECONDS": "30",
            "FINETUNE_LEADER_ELECTION": "true",
            "FINETUNE_LEASE_NAMESPACE": IDENTITY_NAMESPACE,
            "FINETUNE_LEASE_NAME": LEASE,
        }
        log = self.folder / f"{self.account}-{self.starts}.log"
        self.proc = OperatorProcess(self.kubeconfig, self.namespace, log, env).start()
        return self

    def leads(self) -> bool | None:
        """Its metric `finetune_leader`; None when it does not answer (dead, or not up yet)."""
        if self.proc is None or self.proc.proc is None or self.proc.proc.poll() is not None:
            return None
        try:
            text = self.proc.metrics()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("finetune_leader "):
                return float(line.split()[1]) == 1.0
        return None

    def writes(self) -> int:
        return dispatched(self.kube, self.writes_flow)

    def kill(self) -> None:
        assert self.proc is not None and self.proc.proc is not None
        os.killpg(self.proc.proc.pid, signal.SIGKILL)
        self.proc.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def lease_holder(kube: client.ApiClient) -> tuple[str, int]:
    """(holderIdentity, leaseTransitions) of the Lease."""
    try:
        lease = client.CoordinationV1Api(kube).read_namespaced_lease(LEASE, IDENTITY_NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return "", 0
        raise
    return lease.spec.holder_identity or "", lease.spec.lease_transitions or 0


def delete_lease(kube: client.ApiClient) -> None:
    with contextlib.suppress(ApiException):
        client.CoordinationV1Api(kube).delete_namespaced_lease(LEASE, IDENTITY_NAMESPACE)


def the_leader(replicas: list[Replica], timeout: float) -> Replica:
    """The one replica that says it leads, once every live one has said what it is."""

    def settled() -> Replica | None:
        states = [r.leads() for r in replicas]
        leading = [r for r, s in zip(replicas, states, strict=True) if s]
        return leading[0] if len(leading) == 1 and None not in states else None

    return wait_for(settled, timeout, "exactly one leader among the replicas", 0.2)


def takeover(standby: Replica, killed_at: float, timeout: float) -> float:
    """Seconds from the kill until the standby says it leads."""
    wait_for(standby.leads, timeout, f"{standby.account} to take over", 0.1)
    return time.monotonic() - killed_at


@pytest.fixture
def replicas(cluster: Cluster, kube: client.ApiClient, namespace: str, tmp_path: Path) -> Any:
    core = client.CoreV1Api(kube)
    load_pvcs(core, namespace)
    delete_lease(kube)
    pair = [Replica(kube, cluster, tmp_path, name, namespace) for name in ("leader-a", "leader-b")]
    yield pair
    for replica in pair:
        replica.stop()
    delete_lease(kube)


def test_one_leader_the_standby_writes_nothing_and_takes_over(
    kube: client.ApiClient, namespace: str, replicas: list[Replica]
) -> None:
    core = client.CoreV1Api(kube)
    nodes = add_gpu_nodes(core, f"leader-{time.strftime('%H%M%S')}", 4)
    jobs = Jobs(kube, namespace)
    try:
        with JobWatch(kube, namespace) as seen:
            for replica in replicas:
                replica.start(FAST)
            leader = the_leader(replicas, 30)
            (standby,) = [r for r in replicas if r is not leader]
            holder, transitions = lease_holder(kube)
            assert holder.split("_")[0], holder
            standby_writes = standby.writes()
            leader_writes = leader.writes()

            before = [f"before-{i}" for i in range(4)]
            for name in before:
                jobs.create(name, LOAD_SPEC)
            wait_for(lambda: all(jobs.status(n).get("phase") in TERMINAL for n in before), 120, "jobs terminal")
            # The counter works (the leader's writes show in its own), and the standby's is still.
            assert leader.writes() - leader_writes >= 2 * len(before)
            assert standby.writes() - standby_writes == 0, "the standby wrote"
            assert standby.leads() is False

            killed_at = time.monotonic()
            leader.kill()
            seconds = takeover(standby, killed_at, FAST.duration_s + 5)
            new_holder, new_transitions = lease_holder(kube)
            assert new_holder != holder and new_transitions == transitions + 1, (holder, new_holder)
            print(json.dumps({"takeover_s": round(seconds, 2), "lease_duration_s": FAST.duration_s}))

            after = [f"after-{i}" for i in range(2)]
            for name in after:
                jobs.create(name, LOAD_SPEC)
            names = before + after
            wait_for(lambda: all(jobs.status(n).get("phase") == "Succeeded" for n in names), 120, "all Succeeded")
            assert sorted(seen.seen) == sorted(names) and not seen.created_twice
    finally:
        remove_nodes(core, nodes)


def test_a_leader_stopped_cleanly_hands_over_at_once(
    kube: client.ApiClient, namespace: str, replicas: list[Replica]
) -> None:
    """SIGTERM (a rolling update, a drain): the leader gives the Lease up, so the standby needs at
    most a retry period or two, not a whole lease duration."""
    for replica in replicas:
        replica.start(FAST)
    leader = the_leader(replicas, 30)
    (standby,) = [r for r in replicas if r is not leader]
    stopped_at = time.monotonic()
    leader.stop()
    seconds = takeover(standby, stopped_at, FAST.duration_s)
    assert seconds < FAST.duration_s - FAST.retry_s, f"took {seconds:.1f} s: the Lease was not given up"


# --- the soak: the leader killed 20 times during a 500-job burst ----------------------------


def leader_chaos(
    cluster: Cluster, kube: client.ApiClient, tmp_path: Path, jobs: int, kills: int, seed: int, timings: Timings
) -> dict[str, Any]:
    rng = random.Random(seed)
    core = client.CoreV1Api(kube)
    stamp = time.strftime("%H%M%S")
    namespace = f"leader-chaos-{stamp}"
    core.create_namespace({"metadata": {"name": namespace, "labels": {"finetune.dev/test": "true"}}})
    nodes = add_gpu_nodes(core, f"lchaos-{stamp}", max(4, jobs // 10))
    delete_lease(kube)
    pair = [Replica(kube, cluster, tmp_path, name, namespace) for name in ("leader-a", "leader-b")]
    names = [f"job-{i:04d}" for i in range(jobs)]
    ft = Jobs(kube, namespace)
    takeovers: list[dict[str, Any]] = []
    try:
        wait_for(lambda: has_default_sa(core, namespace), 30, "default SA")
        load_pvcs(core, namespace)
        with JobWatch(kube, namespace) as seen:
            for replica in pair:
                replica.start(timings)
            started = time.monotonic()
            pending = list(names)
            for kill in range(kills):
                leader = the_leader(pair, timings.duration_s + 30)
                (standby,) = [r for r in pair if r is not leader]
                # Submit in bursts until the next kill, 10-30 s away.
                until = time.monotonic() + rng.uniform(10.0, 30.0)
                share = max(1, len(pending) // max(1, kills - kill))
                for name in pending[:share]:
                    ft.create(name, LOAD_SPEC)
                pending = pending[share:]
                time.sleep(max(0.0, until - time.monotonic()))
                killed_at = time.monotonic()
                leader.kill()
                seconds = takeover(standby, killed_at, timings.duration_s + 30)
                takeovers.append(
                    {"kill": kill + 1, "after_s": round(killed_at - started, 1), "takeover_s": round(seconds, 2)}
                )
                leader.start(timings)  # as its Deployment would: back as a standby
            for name in pending:
                ft.create(name, LOAD_SPEC)

            def terminal() -> int:
                listed = client.CustomObjectsApi(kube).list_namespaced_custom_object(
                    "finetune.dev", "v1alpha1", namespace, "finetunejobs"
                )["items"]
                return sum(1 for o in listed if (o.get("status") or {}).get("phase") in TERMINAL)

            wait_for(lambda: terminal() >= jobs, 600 + jobs, f"every job terminal (have {terminal()})", 2)
            converged_s = time.monotonic() - started
            duplicates = list(seen.created_twice)
            created = len(seen.seen)
        limit = timings.duration_s + 5
        result = {
            "jobs": jobs,
            "kills": len(takeovers),
            "lease_duration_s": timings.duration_s,
            "renew_deadline_s": timings.renew_s,
            "retry_period_s": timings.retry_s,
            "takeover_max_s": max(t["takeover_s"] for t in takeovers),
            "takeover_median_s": sorted(t["takeover_s"] for t in takeovers)[len(takeovers) // 2],
            "takeovers_over_limit": sum(1 for t in takeovers if t["takeover_s"] > limit),
            "jobs_created": created,
            "duplicate_jobs": len(duplicates),
            "stuck": jobs - terminal(),
            "seconds_to_all_terminal": round(converged_s, 1),
            "takeovers": takeovers,
        }
    finally:
        for replica in pair:
            replica.stop()
        delete_lease(kube)
        core.delete_namespace(namespace, propagation_policy="Background")
        remove_nodes(core, nodes)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"leader-chaos-{jobs}x{kills}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "takeovers"}))
    return result


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_leader_killed_20_times_during_500_jobs(cluster: Cluster, kube: client.ApiClient, tmp_path: Path) -> None:
    result = leader_chaos(cluster, kube, tmp_path, jobs=500, kills=20, seed=43, timings=CHART_DEFAULTS)
    assert result["kills"] == 20
    assert result["takeovers_over_limit"] == 0, result["takeovers"]
    assert result["jobs_created"] == 500 and result["duplicate_jobs"] == 0, result
    assert result["stuck"] == 0, result

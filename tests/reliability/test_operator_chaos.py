"""The operator SIGKILLed at random moments (and made to exit between two creates by its test
hook) while jobs go through their whole life on fake GPU nodes.

Proven: the kills were of the kinds reported (each hooked run either exited by the hook with
its code or was SIGKILLed; an unhooked run never exited by itself), no Event said twice (a
job's Events are its trouble, each once: here the InvalidData failure), zero duplicate
children (one Job per job and nothing else of its own, one trainer ServiceAccount, Role and
RoleBinding for the namespace, never a Job deleted and made again),
zero stuck jobs, and every job's terminal status true:
Succeeded for those whose pod succeeded, Failed with the trainer's reason for those whose pod
exited with InvalidData.
"""

import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from finetune_operator.crash_hook import CRASH_EXIT_CODE
from tests.fixtures.cluster import Cluster
from tests.reliability.cluster_kit import LOAD_SPEC
from tests.support.harness import NO_INPUT_CHECK, Jobs, OperatorProcess, wait_for

from .cluster_kit import (
    JobWatch,
    PodFailer,
    add_gpu_nodes,
    children_of,
    has_default_sa,
    load_pvcs,
    our_identity,
    remove_nodes,
    trainer_identities,
)

pytestmark = pytest.mark.cluster

RESULTS = Path(__file__).resolve().parents[2] / ".cache" / "reliability"
# The identity's kinds are created once per namespace: a hooked run that finds them made
# already does not exit by itself and is SIGKILLed like the others.
CRASH_KINDS = ("ServiceAccount", "Role", "RoleBinding", "Job")
EXPECTED_CHILDREN = {"Job": 1, "ConfigMap": 0, "ServiceAccount": 0, "Role": 0, "RoleBinding": 0}
ONE_IDENTITY = {"ServiceAccount": 1, "Role": 1, "RoleBinding": 1}


def chaos(cluster: Cluster, kube: client.ApiClient, tmp_path: Path, jobs: int, kills: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    core = client.CoreV1Api(kube)
    stamp = time.strftime("%H%M%S")
    namespace = f"chaos-op-{stamp}"
    core.create_namespace({"metadata": {"name": namespace, "labels": {"finetune.dev/test": "true"}}})
    nodes = add_gpu_nodes(core, f"chaos-{stamp}", max(4, jobs // 4))
    config = our_identity(kube, cluster.kubeconfig, tmp_path, "chaos")
    log = tmp_path / "operator.log"
    names = [f"job-{i:03d}" for i in range(jobs)]
    failing = {n for n in names if rng.random() < 0.3}
    ft = Jobs(kube, namespace)
    kill_log: list[dict[str, Any]] = []
    operator: OperatorProcess | None = None
    try:
        wait_for(lambda: has_default_sa(core, namespace), 30, "default SA")
        load_pvcs(core, namespace)
        message = "InvalidData: line 3: instruction: empty text"
        with JobWatch(kube, namespace) as seen, PodFailer(kube, namespace, failing, 11, message):
            pending = list(names)
            started = time.monotonic()
            for round_ in range(kills):
                crash_after = rng.choice(CRASH_KINDS) if round_ % 2 else None
                env = {"FINETUNE_TEST_CRASH_AFTER": crash_after} if crash_after else {}
                operator = OperatorProcess(
                    config, namespace, log, env={**env, **NO_INPUT_CHECK, "FINETUNE_LOG_LEVEL": "INFO"}
                )
                operator.start(wait=False)
                # Feed jobs in while the operator lives, a burst per round.
                burst = max(1, len(pending) // max(1, kills - round_))
                for name in pending[:burst]:
                    ft.create(name, LOAD_SPEC)
                pending = pending[burst:]
                # A hooked run needs time to reach its first create of that kind and exit by itself.
                time.sleep(rng.uniform(3.0, 6.0) if crash_after else rng.uniform(0.5, 4.0))
                assert operator.proc is not None
                exited = operator.proc.poll()
                if exited is None:
                    os.killpg(operator.proc.pid, signal.SIGKILL)
                    operator.proc.wait(10)
                kill_log.append(
                    {"after_s": round(time.monotonic() - started, 1), "hook": crash_after, "exited": exited}
                )
            for name in pending:
                ft.create(name, LOAD_SPEC)
            operator = OperatorProcess(
                config, namespace, log, env=NO_INPUT_CHECK | {"FINETUNE_LOG_LEVEL": "INFO"}
            ).start()
            terminal = ("Succeeded", "Failed")

            def all_terminal() -> bool:
                return all(ft.status(n).get("phase") in terminal for n in names)

            wait_for(all_terminal, 120 + jobs * 3, "every job terminal", interval=2)
            converged_s = time.monotonic() - started
            duplicates_seen = list(seen.created_twice)
        children = children_of(kube, namespace)
        wrong_children: dict[str, Any] = {
            n: c for n, c in children.items() if {k: c.get(k, 0) for k in EXPECTED_CHILDREN} != EXPECTED_CHILDREN
        }
        identity = trainer_identities(kube, namespace)
        if identity != ONE_IDENTITY:
            wrong_children["(trainer identity)"] = identity
        wrong_status: dict[str, Any] = {}
        exits = _pod_exit_codes(core, namespace)
        for name in names:
            status = ft.status(name)
            # The truth is what the pod really did (KWOK may end a pod before it was marked to fail).
            want = "Failed" if exits.get(name) == 11 else "Succeeded"
            failed = next((c for c in status.get("conditions") or [] if c["type"] == "Failed"), {})
            if status.get("phase") != want or (want == "Failed" and failed.get("reason") != "InvalidData"):
                wrong_status[name] = {"phase": status.get("phase"), "failed": failed, "message": status.get("message")}
            elif status.get("restarts"):
                wrong_status[name] = {"restarts": status.get("restarts")}
        said = _events_said(core, namespace)
        result = {
            "jobs": jobs,
            "kills": len(kill_log),
            "failing_jobs": sum(1 for c in exits.values() if c == 11),
            "duplicate_children": len(wrong_children),
            "jobs_recreated": len(duplicates_seen),
            "stuck": sum(1 for n in names if ft.status(n).get("phase") not in ("Succeeded", "Failed")),
            "wrong_status": len(wrong_status),
            "events_said_twice": sum(1 for c in said.values() if c > 1),
            "seconds_to_all_terminal": round(converged_s, 1),
            "kill_modes": kill_modes(kill_log),
            "kill_log": kill_log,
            "details": {"wrong_children": wrong_children, "wrong_status": wrong_status},
        }
    finally:
        if operator is not None:
            operator.stop()
        core.delete_namespace(namespace, propagation_policy="Background")
        remove_nodes(core, nodes)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"operator-chaos-{jobs}x{kills}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("kill_log", "details")}))
    return result


def _pod_exit_codes(core: client.CoreV1Api, namespace: str) -> dict[str, int]:
    """Per job: the exit code its (last) pod terminated with."""
    codes: dict[str, int] = {}
    for pod in core.list_namespaced_pod(namespace, label_selector="finetune.dev/job").items:
        for cs in pod.status.container_statuses or []:
            if cs.state and cs.state.terminated:
                codes[pod.metadata.labels["finetune.dev/job"]] = cs.state.terminated.exit_code
    return codes


def _events_said(core: client.CoreV1Api, namespace: str) -> dict[tuple[str, str], int]:
    """How often each (FineTuneJob, reason) Event was posted. (Records before the operator posted
    trouble only counted JobCreated Events, as `job_created_events_over_1`.)"""
    counts: dict[tuple[str, str], int] = {}
    for event in core.list_namespaced_event(namespace).items:
        if event.involved_object.kind == "FineTuneJob":
            key = (event.involved_object.name, event.reason)
            counts[key] = counts.get(key, 0) + (event.count or 1)
    return counts


def kill_modes(kill_log: list[dict[str, Any]]) -> dict[str, int]:
    """How each operator of the run ended: by the crash hook right after creating a child, or by
    our SIGKILL (a hooked run whose kind was already made never reaches its hook)."""
    hook_exits = sum(1 for k in kill_log if k["hook"] is not None and k["exited"] == CRASH_EXIT_CODE)
    return {"sigkill": sum(1 for k in kill_log if k["exited"] is None), "hook_exit": hook_exits}


def check(result: dict[str, Any]) -> None:
    log = result["kill_log"]
    # An operator that exited without the hook, or with another code, died of its own accord.
    unexplained = [k for k in log if k["exited"] is not None and (k["hook"] is None or k["exited"] != CRASH_EXIT_CODE)]
    assert not unexplained, f"operator exits not caused by the test: {unexplained}"
    assert result["kills"] == len(log), result
    assert result["kill_modes"] == kill_modes(log), (result["kill_modes"], kill_modes(log))
    assert sum(result["kill_modes"].values()) == result["kills"], result["kill_modes"]
    assert result.get("events_said_twice", result.get("job_created_events_over_1")) == 0, result
    assert result["duplicate_children"] == 0, result["details"]["wrong_children"]
    assert result["jobs_recreated"] == 0, result
    assert result["stuck"] == 0, result
    assert result["wrong_status"] == 0, result["details"]["wrong_status"]


def test_operator_kills_short(cluster: Cluster, kube: client.ApiClient, tmp_path: Path) -> None:
    check(chaos(cluster, kube, tmp_path, jobs=12, kills=4, seed=1))


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_operator_killed_20_times_under_50_jobs(cluster: Cluster, kube: client.ApiClient, tmp_path: Path) -> None:
    result = chaos(cluster, kube, tmp_path, jobs=50, kills=20, seed=20)
    check(result)
    assert result["kills"] == 20
    # The soak's claim is both kinds of death: at random moments and right after a create.
    assert result["kill_modes"]["sigkill"] >= 1 and result["kill_modes"]["hook_exit"] >= 1, result["kill_modes"]

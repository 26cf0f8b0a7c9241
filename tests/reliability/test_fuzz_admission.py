"""Fuzzed FineTuneJob specs through the real API server and the operator.

Each spec is either rejected at admission with a message, or accepted and then reconciled by
the operator (a phase in its status; Failed/Invalid when the models refuse what the CRD let
through). The operator must neither crash nor log an unhandled exception. The namespace has a
pod quota of zero: the Jobs are created and reconciled, but no pod ever runs.

Also checked: admission and `ftjob validate` agree. A spec the models accept and the API
server refuses (or the reverse, unless the operator then fails it) is drift between the CRD
and the models.
"""

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from finetune_api.constants import GROUP, PLURAL, VERSION
from finetune_api.manifest import parse_document
from tests.fixtures.cluster import Cluster
from tests.support.harness import OperatorProcess

from .cluster_kit import our_identity
from .spec_strategies import SpecCase, manifest, spec_cases

pytestmark = pytest.mark.cluster

RESULTS = Path(__file__).resolve().parents[2] / ".cache" / "reliability"
CI_SPECS = 100
SOAK_SPECS = 1000


def offline_valid(body: dict[str, Any]) -> bool:
    return not parse_document(body).problems


def _has_nan(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value) or math.isinf(value)
    if isinstance(value, dict):
        return any(_has_nan(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_nan(v) for v in value)
    return False


def log_problems(operator: OperatorProcess) -> list[str]:
    bad = []
    for record in operator.log_records():
        level = str(record.get("levelname") or record.get("level") or record.get("severity") or "").lower()
        text = json.dumps(record)
        # kopf logs a throttled request (429) it is about to retry at error level; that is the
        # API server pushing back under load, handled by the retry, not an operator failure.
        retried = "will retry" in str(record.get("message", "")) and "Traceback" not in text
        if (level in ("error", "critical", "fatal") or "Traceback" in text or record.get("exc_info")) and not retried:
            bad.append(text[:600])
    raw = operator.log.read_text(errors="replace") if operator.log.exists() else ""
    if "Traceback (most recent call last)" in raw and not bad:
        bad.append(raw[raw.index("Traceback") :][:1500])
    return bad


def fuzz(cluster: Cluster, kube: client.ApiClient, namespace: str, tmp_path: Path, count: int) -> dict[str, Any]:
    core = client.CoreV1Api(kube)
    custom = client.CustomObjectsApi(kube)
    core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}})
    operator = OperatorProcess(
        our_identity(kube, cluster.kubeconfig, tmp_path, "fuzz"),
        namespace,
        tmp_path / "operator.log",
        env={"FINETUNE_LOG_LEVEL": "INFO", "FINETUNE_RESYNC_SECONDS": "10"},
    ).start()
    accepted: dict[str, SpecCase] = {}
    rejected: list[dict[str, Any]] = []
    drift: list[dict[str, Any]] = []
    counter = 0

    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(case=spec_cases())
    def submit(case: SpecCase) -> None:
        nonlocal counter
        name = f"fz-{counter:05d}"
        counter += 1
        body = manifest(name, case.spec)
        valid = offline_valid(body)
        try:
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict")
        except ApiException as exc:
            message = str(exc.body or exc.reason or "")
            rejected.append({"name": name, "status": exc.status, "message": message[:300], "what": case.what})
            assert exc.status in (400, 422), f"{case.what}: HTTP {exc.status}: {message[:500]}"
            assert message.strip(), f"{case.what}: rejected without a message"
            if valid and not _has_nan(case.spec):
                drift.append(
                    {"name": name, "what": case.what, "admission": message[:300], "spec": repr(case.spec)[:300]}
                )
            return
        except ValueError:
            # NaN/inf cannot be written as JSON at all: refused before it reaches the server.
            assert _has_nan(case.spec), case.what
            rejected.append({"name": name, "status": 0, "message": "not JSON", "what": case.what})
            return
        accepted[name] = case

    try:
        submit()
        started = time.monotonic()

        def phases() -> dict[str, str | None]:
            items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
            return {i["metadata"]["name"]: (i.get("status") or {}).get("phase") for i in items}

        deadline = started + 60 + len(accepted) * 0.5
        final = phases()
        while time.monotonic() < deadline and not all(final.get(n) for n in accepted):
            time.sleep(2)
            final = phases()
        reconciled_s = time.monotonic() - started
        unreconciled = [
            {"name": n, "what": c.what, "spec": repr(c.spec)[:400]} for n, c in accepted.items() if not final.get(n)
        ]
        for name, case in accepted.items():
            if not offline_valid(manifest(name, case.spec)) and final[name] != "Failed":
                drift.append({"name": name, "what": case.what, "admission": "accepted", "phase": final[name]})
        alive = operator.proc is not None and operator.proc.poll() is None
        problems = log_problems(operator)
    finally:
        operator.stop()
    result = {
        "specs": counter,
        "accepted": len(accepted),
        "rejected": len(rejected),
        "phases": {p: sum(1 for n in accepted if final.get(n) == p) for p in {final.get(n) for n in accepted}},
        "operator_alive": alive,
        "operator_errors": len(problems),
        "drift": len(drift),
        "unreconciled": len(unreconciled),
        "seconds_to_reconcile_all": round(reconciled_s, 1),
        "details": {
            "unreconciled": unreconciled[:10],
            "drift": drift[:20],
            "errors": problems[:10],
            "rejected_sample": rejected[:5],
        },
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"fuzz-admission-{count}.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: v for k, v in result.items() if k != "details"}))
    return result


def check(result: dict[str, Any]) -> None:
    assert result["operator_alive"], result
    assert result["unreconciled"] == 0, result["details"]["unreconciled"]
    assert result["operator_errors"] == 0, result["details"]["errors"]
    assert result["drift"] == 0, result["details"]["drift"]


def test_fuzzed_specs_through_admission_and_operator(
    cluster: Cluster, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    check(fuzz(cluster, kube, namespace, tmp_path, CI_SPECS))


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_fuzzed_spec_corpus_through_admission(
    cluster: Cluster, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    result = fuzz(cluster, kube, namespace, tmp_path, SOAK_SPECS)
    check(result)
    assert result["specs"] >= 1000

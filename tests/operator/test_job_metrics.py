"""Per-job metrics (job_metrics.py) from FineTuneJob bodies as the API server holds them: what the
chart's alerts and dashboard read. The e2e test against the operator's own /metrics is in
test_e2e_job_metrics.py."""

import datetime
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from finetune_operator.job_metrics import JobCollector, families
from finetune_operator.runtime.cache import WatchCache

RUNNING_SINCE = "2026-01-01T10:00:00Z"
REPORTED = "2026-01-01T10:05:00Z"


def _unix(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _ftj(name: str, phase: str | None, **status: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "finetune.dev/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": name, "namespace": "team-a", "resourceVersion": "1"},
        "spec": {"resources": {"gpus": 2, "nodes": 2}},
        "status": {**status, **({"phase": phase} if phase else {})},
    }
    return body


def _pod(name: str, phase: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team-a", "resourceVersion": "1"}, "status": {"phase": phase}}


def _running(since: str = RUNNING_SINCE) -> dict[str, Any]:
    return {"type": "Running", "status": "True", "reason": "Running", "lastTransitionTime": since}


def _samples(
    pairs: list[tuple[dict[str, Any], list[dict[str, Any]]]],
) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in families(pairs)
        for sample in family.samples
    }


def _of(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], metric: str, /, **labels: str) -> float | None:
    return samples.get((metric, frozenset({"namespace": "team-a", **labels}.items())))


def test_a_running_job_exports_its_phase_progress_loss_gpus_and_running_pods() -> None:
    progress = {
        "step": 40,
        "totalSteps": 100,
        "percent": 40.0,
        "loss": 1.25,
        "evalLoss": 1.5,
        "tokensPerSecond": 812.5,
        "updatedAt": REPORTED,
    }
    job = _ftj("llama", "Running", progress=progress, conditions=[_running()], restarts=1, oomRetry={"pod": "llama-x"})
    pods = [_pod("llama-0-a", "Running"), _pod("llama-1-b", "Running"), _pod("llama-0-old", "Failed")]
    got = _samples([(job, pods)])
    assert _of(got, "finetune_job_phase", name="llama", phase="Running") == 1
    assert _of(got, "finetune_job_progress_step", name="llama") == 40
    assert _of(got, "finetune_job_progress_total_steps", name="llama") == 100
    assert _of(got, "finetune_job_progress_ratio", name="llama") == 0.4
    assert _of(got, "finetune_job_loss", name="llama") == 1.25
    assert _of(got, "finetune_job_eval_loss", name="llama") == 1.5
    assert _of(got, "finetune_job_tokens_per_second", name="llama") == 812.5
    assert _of(got, "finetune_job_restarts", name="llama") == 1
    assert _of(got, "finetune_job_oom_retries", name="llama") == 1
    assert _of(got, "finetune_job_gpus", name="llama") == 4  # 2 GPUs x 2 nodes
    assert _of(got, "finetune_job_last_progress_timestamp_seconds", name="llama") == _unix(REPORTED)
    pods_seen = {dict(labels)["pod"] for (name, labels) in got if name == "finetune_job_pod"}
    assert pods_seen == {"llama-0-a", "llama-1-b"}
    assert not [key for key in got if key[0] == "finetune_job_failed"]


def test_a_new_attempt_counts_no_progress_from_its_own_start() -> None:
    """A report from the attempt before must not make a fresh Running spell look stuck."""
    later = "2026-01-01T11:00:00Z"
    job = _ftj("again", "Running", progress={"step": 7, "updatedAt": REPORTED}, conditions=[_running(later)])
    assert _of(_samples([(job, [])]), "finetune_job_last_progress_timestamp_seconds", name="again") == _unix(later)
    loading = _ftj("loading", "Running", conditions=[_running()])
    got = _samples([(loading, [])])
    assert _of(got, "finetune_job_last_progress_timestamp_seconds", name="loading") == _unix(RUNNING_SINCE)
    assert _of(got, "finetune_job_progress_step", name="loading") is None


def test_a_failed_job_exports_its_reason_and_no_pods() -> None:
    failed = {"type": "Failed", "status": "True", "reason": "Unschedulable", "lastTransitionTime": REPORTED}
    job = _ftj("h100", "Failed", conditions=[failed])
    got = _samples([(job, [_pod("h100-0", "Running")])])
    assert _of(got, "finetune_job_failed", name="h100", reason="Unschedulable") == 1
    assert _of(got, "finetune_job_phase", name="h100", phase="Failed") == 1
    assert not [key for key in got if key[0] == "finetune_job_pod"]
    assert _of(got, "finetune_job_oom_retries", name="h100") == 0


def test_a_job_not_reconciled_yet_exports_nothing_and_gpus_default_as_the_api_does() -> None:
    assert _samples([(_ftj("new", None), [])]) == {}
    bare = _ftj("bare", "Pending")
    bare["spec"] = {}
    assert _of(_samples([(bare, [])]), "finetune_job_gpus", name="bare") == 4


def test_the_collector_reads_the_watch_cache_at_scrape_time() -> None:
    cache = WatchCache()
    registry = CollectorRegistry()
    registry.register(JobCollector(cache))
    cache.put_finetunejob(_ftj("llama", "Running", conditions=[_running()]))
    cache.put_pod("llama", _pod("llama-0-a", "Running"))

    def scrape() -> dict[str, list[dict[str, str]]]:
        text = generate_latest(registry).decode()
        return {f.name: [s.labels for s in f.samples] for f in text_string_to_metric_families(text)}

    seen = scrape()
    assert seen["finetune_job_phase"] == [{"namespace": "team-a", "name": "llama", "phase": "Running"}]
    assert seen["finetune_job_pod"] == [{"namespace": "team-a", "name": "llama", "pod": "llama-0-a"}]
    cache.forget("team-a", "llama")
    gone = scrape()
    assert gone["finetune_job_phase"] == [] and gone["finetune_job_gpus"] == []

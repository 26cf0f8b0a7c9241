"""Per-job metrics, read from the watch cache at scrape time: what the chart's alerts and dashboard
need (phase, failure reason, progress and when it last moved, loss, GPUs, the trainer's pods).

Computed on each scrape from the FineTuneJobs the operator already holds, so the numbers are as
true as the cache after a restart or a missed event, and a deleted job's series vanish with it.
Labels are `namespace` and `name` (plus `phase`, `reason` or `pod` where a metric says so): one
series per job per metric, never per step or per attempt.
"""

import datetime
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

Body = Mapping[str, Any]
JOB_LABELS: Final = ("namespace", "name")
# The API's default for spec.resources.gpus (finetune_api.spec.Resources), read here without parsing the spec.
DEFAULT_GPUS: Final = 4


@dataclass(frozen=True)
class Gauge:
    """One (namespace, name)-labelled gauge family: its name, help, and how to read a job's value."""

    name: str
    help: str
    value: Callable[[Body], float | None]


def _timestamp(stamp: object) -> float | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _status(body: Body) -> Body:
    return body.get("status") or {}


def _progress(body: Body) -> Body:
    return _status(body).get("progress") or {}


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _condition(body: Body, kind: str) -> Body:
    return next((c for c in _status(body).get("conditions") or [] if c.get("type") == kind), {})


def running_since(body: Body) -> float | None:
    """When the job last started Running: its Running condition's last flip to True."""
    running = _condition(body, "Running")
    return _timestamp(running.get("lastTransitionTime")) if running.get("status") == "True" else None


def last_progress(body: Body) -> float | None:
    """The later of the trainer's last progress report and the start of the current Running
    spell: a new attempt (or a trainer still loading the model) has its whole window before
    "no progress" counts, and a report from an earlier attempt never makes a fresh one look stuck."""
    stamps = [s for s in (_timestamp(_progress(body).get("updatedAt")), running_since(body)) if s is not None]
    return max(stamps) if stamps else None


def gpus(body: Body) -> float:
    resources = (body.get("spec") or {}).get("resources") or {}
    per_pod = resources.get("gpus", DEFAULT_GPUS)
    return float(int(per_pod) * int(resources.get("nodes", 1)))


# (namespace, name)-labelled gauges, one value per job (absent when the job has none yet).
GAUGES: Final = (
    Gauge(
        "finetune_job_progress_step",
        "Optimizer step the trainer last reported.",
        lambda b: _number(_progress(b).get("step")),
    ),
    Gauge(
        "finetune_job_progress_total_steps",
        "Optimizer steps the run will take.",
        lambda b: _number(_progress(b).get("totalSteps")),
    ),
    Gauge(
        "finetune_job_progress_ratio",
        "Share of the run done, 0 to 1.",
        lambda b: None if (p := _number(_progress(b).get("percent"))) is None else p / 100,
    ),
    Gauge(
        "finetune_job_last_progress_timestamp_seconds",
        "Unix time of the trainer's last progress report, or of the job's start of Running if later.",
        last_progress,
    ),
    Gauge("finetune_job_loss", "Training loss at the last report.", lambda b: _number(_progress(b).get("loss"))),
    Gauge(
        "finetune_job_eval_loss",
        "Loss on the held-out split at the last evaluation.",
        lambda b: _number(_progress(b).get("evalLoss")),
    ),
    Gauge(
        "finetune_job_tokens_per_second",
        "Training throughput at the last report.",
        lambda b: _number(_progress(b).get("tokensPerSecond")),
    ),
    Gauge(
        "finetune_job_restarts",
        "Trainer attempts that failed and were retried (status.restarts).",
        lambda b: _number(_status(b).get("restarts")),
    ),
    Gauge(
        "finetune_job_oom_retries",
        "1 once the GPU ran out of memory and the job was retried on a tighter plan (status.oomRetry), else 0.",
        lambda b: 1.0 if _status(b).get("oomRetry") else 0.0,
    ),
    Gauge("finetune_job_gpus", "GPUs the job asks for: gpus per pod x nodes.", gpus),
)


def _key(body: Body) -> list[str]:
    meta = body.get("metadata") or {}
    return [str(meta.get("namespace", "")), str(meta.get("name", ""))]


def families(jobs: Iterable[tuple[Body, Sequence[Body]]]) -> list[GaugeMetricFamily]:
    """Every per-job family for these (FineTuneJob, its pods) pairs; pure, so tests feed it bodies."""
    phase = GaugeMetricFamily(
        "finetune_job_phase", "1 for the phase each FineTuneJob is in (status.phase).", labels=[*JOB_LABELS, "phase"]
    )
    failed = GaugeMetricFamily(
        "finetune_job_failed", "1 for each Failed FineTuneJob, with its reason.", labels=[*JOB_LABELS, "reason"]
    )
    pods = GaugeMetricFamily(
        "finetune_job_pod",
        "1 for each running trainer pod of a Running FineTuneJob (to join GPU exporters' per-pod series).",
        labels=[*JOB_LABELS, "pod"],
    )
    gauges = [(g, GaugeMetricFamily(g.name, g.help, labels=list(JOB_LABELS))) for g in GAUGES]
    for body, job_pods in jobs:
        key = _key(body)
        current = _status(body).get("phase")
        if not current:
            continue  # not reconciled yet: nothing to say about it
        phase.add_metric([*key, str(current)], 1.0)
        if current == "Failed":
            failed.add_metric([*key, str(_condition(body, "Failed").get("reason") or "Unknown")], 1.0)
        if current == "Running":
            for pod in job_pods:
                if (pod.get("status") or {}).get("phase") == "Running":
                    pods.add_metric([*key, str((pod.get("metadata") or {}).get("name", ""))], 1.0)
        for gauge, family in gauges:
            value = gauge.value(body)
            if value is not None:
                family.add_metric(key, value)
    return [phase, failed, pods, *(family for _, family in gauges)]


class JobSource(Protocol):
    """What the collector reads: the watch cache (runtime.cache.WatchCache), named by shape so
    that metrics stay below the runtime in the imports."""

    def finetunejob_keys(self) -> list[tuple[str, str]]: ...

    def finetunejob(self, namespace: str, name: str) -> Body | None: ...

    def pods(self, namespace: str, job_name: str) -> Sequence[Body]: ...


class JobCollector(Collector):
    """Reads the watch cache on each scrape."""

    def __init__(self, cache: JobSource, serving: Callable[[], bool] = lambda: True) -> None:
        self._cache = cache
        self._serving = serving

    def _jobs(self) -> Iterator[tuple[Body, Sequence[Body]]]:
        if not self._serving():
            return  # a standby: the leader serves each job's series, once
        for namespace, name in self._cache.finetunejob_keys():
            body = self._cache.finetunejob(namespace, name)
            if body is not None:
                yield body, self._cache.pods(namespace, name)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from families(self._jobs())

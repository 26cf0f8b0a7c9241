"""Prometheus metrics: jobs by phase, reconcile latency and backlog, paced writes, API errors,
Events posted."""

import threading
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

PHASES: Final = ("Pending", "Queued", "Admitted", "Preempted", "Running", "Suspended", "Succeeded", "Failed")

REGISTRY = CollectorRegistry()
JOBS = Gauge("finetune_jobs", "FineTuneJobs seen by this operator, by phase.", ["phase"], registry=REGISTRY)
RECONCILE_SECONDS = Histogram(
    "finetune_reconcile_seconds",
    "Time one reconcile of one FineTuneJob takes (API calls included).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
API_ERRORS = Counter(
    "finetune_api_errors_total",
    "Kubernetes API calls that failed, by verb, kind and HTTP status.",
    ["verb", "kind", "code"],
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge("finetune_workqueue_depth", "Jobs waiting for a reconcile worker.", registry=REGISTRY)
WRITES_PARKED = Gauge(
    "finetune_status_writes_parked",
    "Jobs whose status or Event write waits while Jobs are being created (pacing).",
    registry=REGISTRY,
)
RECONCILE_RETRIES = Counter(
    "finetune_reconcile_retries_total",
    "Reconciles that failed on an API call and were scheduled again with backoff.",
    registry=REGISTRY,
)
CHILDREN_CREATED = Counter(
    "finetune_children_created_total", "Child objects created, by kind.", ["kind"], registry=REGISTRY
)
EVENTS_POSTED = Counter(
    "finetune_events_total", "Events posted on FineTuneJobs, by reason.", ["reason"], registry=REGISTRY
)


class PhaseBook:
    """The last phase of every job, so the gauge counts each job once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases: dict[tuple[str, str], str] = {}

    def set(self, namespace: str, name: str, phase: str | None) -> None:
        with self._lock:
            if phase is None:
                self._phases.pop((namespace, name), None)
            else:
                self._phases[(namespace, name)] = phase
            counts = dict.fromkeys(PHASES, 0)
            for value in self._phases.values():
                counts[value] = counts.get(value, 0) + 1
        for key, count in counts.items():
            JOBS.labels(phase=key).set(count)


PHASE_BOOK = PhaseBook()


def serve(port: int) -> None:
    if port:
        start_http_server(port, registry=REGISTRY)

"""The operator's own /metrics, end to end on fake GPU nodes (KWOK): a Running job shows its phase,
GPUs, running pods and the start of its Running spell as its last sign of progress; a job above
the GPU limit shows Failed with its reason; every metric the chart's PrometheusRule and Grafana
dashboard read is served. No trainer runs, so the training series stay absent for these jobs."""

import datetime
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.harness import Jobs, OperatorProcess, wait_for
from tests.support.monitoring import FOREIGN, used_metrics
from tests.support.specs import gpu_spec

pytestmark = pytest.mark.cluster

# KWOK keeps the pod Running this long (hack/cluster/kwok_stages.yaml), long past the test.
RUN_LONG = {"spec": {"template": {"metadata": {"annotations": {"kwok.finetune.dev/run-ms": "600s"}}}}}
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _scrape(operator: OperatorProcess) -> tuple[Samples, set[str]]:
    """(every sample by name and labels, every family name served)."""
    samples: Samples = {}
    names: set[str] = set()
    for family in text_string_to_metric_families(operator.metrics()):
        # A labelled counter no label has been set on yet serves its HELP and TYPE only.
        names |= {family.name, f"{family.name}_total"} if family.type == "counter" else {family.name}
        for sample in family.samples:
            names.add(sample.name)
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples, names


def _job(samples: Samples, metric: str, namespace: str, **labels: str) -> float | None:
    return samples.get((metric, frozenset({"namespace": namespace, **labels}.items())))


def test_the_operator_serves_each_jobs_phase_gpus_pods_and_failure_reason(
    jobs: Jobs, start_operator: Callable[..., OperatorProcess]
) -> None:
    operator = start_operator(env={"FINETUNE_MAX_GPUS_PER_JOB": "4"})
    ns = jobs.namespace
    # Created suspended, so its Job's pods can be told to run long before any starts.
    jobs.create("held", gpu_spec(gpus=2, suspend=True))
    wait_for(lambda: jobs.batch.list_namespaced_job(ns).items, 60, "the Job of held")
    jobs.batch.patch_namespaced_job("held", ns, RUN_LONG)
    jobs.patch_spec("held", {"suspend": False})
    jobs.wait_phase("held", "Running", 90)
    jobs.create("greedy", gpu_spec(gpus=8))
    jobs.wait_phase("greedy", "Failed", 60)

    def served() -> tuple[Samples, set[str]] | None:
        samples, names = _scrape(operator)
        pods = [labels for (name, labels) in samples if name == "finetune_job_pod"]
        failed = _job(samples, "finetune_job_failed", ns, name="greedy", reason="ExceedsLimit")
        return (samples, names) if pods and failed else None

    samples, names = wait_for(served, 30, "the held job's pod and greedy's failure on /metrics")
    assert _job(samples, "finetune_job_phase", ns, name="held", phase="Running") == 1
    assert _job(samples, "finetune_job_phase", ns, name="greedy", phase="Failed") == 1
    assert _job(samples, "finetune_job_gpus", ns, name="held") == 2
    running_pods = {p["metadata"]["name"] for p in jobs.pods("held") if p["status"]["phase"] == "Running"}
    served_pods = {dict(labels)["pod"] for (name, labels) in samples if name == "finetune_job_pod"}
    assert served_pods == running_pods and running_pods
    since = jobs.condition("held", "Running")["lastTransitionTime"]
    started = datetime.datetime.fromisoformat(since.replace("Z", "+00:00")).timestamp()
    assert _job(samples, "finetune_job_last_progress_timestamp_seconds", ns, name="held") == started
    assert _job(samples, "finetune_job_progress_step", ns, name="held") is None
    # The chart's alerts and dashboard read only what this operator serves.
    missing = used_metrics() - FOREIGN - names
    assert not missing, f"the rule or dashboard reads metrics /metrics does not serve: {sorted(missing)}"

    jobs.delete("held")
    wait_for(
        lambda: _job(_scrape(operator)[0], "finetune_job_phase", ns, name="held", phase="Running") is None,
        60,
        "held's series gone after its deletion",
    )

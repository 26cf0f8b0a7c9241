"""End to end through the operator: a job's inputs are checked on the CPU before its GPU Job.

A wrong dataset path fails the job naming the claim and the path in it, and no Job asking for
a GPU ever exists: every Job of the namespace is watched for the whole test, and the same job
with the right path, which does get its GPU Job, proves the watch would have seen one."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kubernetes import client, watch

from finetune_api.contract import preflight_job_name
from hack.cluster.nodes import GPU_RESOURCE
from tests.support.harness import Jobs, OperatorProcess, wait_for
from tests.support.specs import body
from tests.support.training import watch_until_done

pytestmark = [pytest.mark.cluster, pytest.mark.trainer]


def p40_job(dataset_path: str) -> dict:
    """One P40 (a KWOK node runs the GPU pod), the tiny model and dataset on claims."""
    return body(
        dataset={"source": {"pvc": {"claimName": "datasets", "path": dataset_path}}, "format": "alpaca"},
        resources={"gpus": 1, "gpuProduct": "Tesla-P40", "cpu": "1", "memory": "2Gi"},
    )


@contextmanager
def gpu_jobs_seen(jobs: Jobs) -> Iterator[set[str]]:
    """Names of the Jobs asking for a GPU that appear in the namespace while the block runs."""
    seen: set[str] = set()
    stop = threading.Event()
    batch = client.BatchV1Api(jobs.api)
    version = batch.list_namespaced_job(jobs.namespace).metadata.resource_version

    def record() -> None:
        nonlocal version
        while not stop.is_set():
            stream = watch.Watch().stream(
                batch.list_namespaced_job, jobs.namespace, resource_version=version, timeout_seconds=2
            )
            for event in stream:
                job = event["object"]
                version = job.metadata.resource_version
                containers = job.spec.template.spec.containers
                if any(GPU_RESOURCE in ((c.resources and c.resources.limits) or {}) for c in containers):
                    seen.add(job.metadata.name)

    thread = threading.Thread(target=record, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(10)


def test_a_wrong_dataset_path_fails_naming_the_claim_and_no_gpu_job_ever_exists(
    jobs: Jobs, training_volumes: dict[str, Path], operator: OperatorProcess
) -> None:
    with gpu_jobs_seen(jobs) as gpu_jobs:
        jobs.create("wrong-path", p40_job("support/train.json"))
        phases, _, status = watch_until_done(jobs, "wrong-path", timeout=180)
        # The control: the same job with the right path gets its GPU Job, and the watch sees it.
        jobs.create("right-path", p40_job("tiny/alpaca.jsonl"))
        wait_for(lambda: "right-path" in gpu_jobs, 180, f"the GPU Job of right-path (seen: {gpu_jobs})")
    assert "wrong-path" not in gpu_jobs, gpu_jobs
    assert jobs.batch.list_namespaced_job(jobs.namespace, label_selector="finetune.dev/job=wrong-path").items
    failed = jobs.condition("wrong-path", "Failed")
    said = "spec.dataset: claim 'datasets', path 'support/train.json': no such file or folder"
    assert (failed["reason"], failed["message"]) == ("InvalidData", said), failed
    assert status["message"] == said
    assert phases == ["Pending", "Failed"], phases  # never Running, never back
    assert jobs.pods("wrong-path") == []  # no trainer pod at all
    (check,) = jobs.pods("wrong-path", preflight=True)
    assert GPU_RESOURCE not in check["spec"]["containers"][0]["resources"]["limits"]
    # The failure is a Warning; the check itself was said by the status alone.
    assert {e["reason"] for e in jobs.events_with("wrong-path", "InvalidData") if e["type"] == "Warning"} >= {
        "InvalidData"
    }
    assert "CheckingInputs" not in {e["reason"] for e in jobs.operator_events("wrong-path", settle_s=0)}


def test_checked_inputs_cost_one_short_cpu_pod_before_the_gpu_job(
    jobs: Jobs, training_volumes: dict[str, Path], operator: OperatorProcess
) -> None:
    jobs.create("checked", p40_job("tiny/alpaca.jsonl"))
    jobs.wait_phase("checked", ("Running", "Succeeded"), 180)
    check = jobs.batch.read_namespaced_job(preflight_job_name("checked"), jobs.namespace)
    gpu_job = jobs.batch.read_namespaced_job("checked", jobs.namespace)
    assert check.status.succeeded == 1
    # The GPU Job is made only after the check ended.
    assert gpu_job.metadata.creation_timestamp >= check.status.completion_time
    spent = (gpu_job.metadata.creation_timestamp - check.metadata.creation_timestamp).total_seconds()
    print(f"\npre-flight: its Job created -> the GPU Job created: {spent:.1f} s")
    assert spent < 120


def test_a_gguf_job_whose_tokenizer_the_converter_refuses_fails_in_the_pre_flight_naming_the_format(
    core: client.CoreV1Api, jobs: Jobs, training_volumes: dict[str, Path], operator: OperatorProcess
) -> None:
    """The tiny model's tokenizer (a byte-level BPE whose pre-tokenizer llama.cpp does not know):
    llama.cpp's converter, run on it by the pre-flight's CPU pod, refuses it before any GPU Job."""
    from finetune_trainer.outputs.gguf_export import CONVERTERS_ENV
    from hack import llama_cpp as pinned
    from tests.support.training import trainer_hooks

    # The image has the converters at /opt/llama.cpp; the node agent's pods are told where they are.
    trainer_hooks(core, jobs.namespace, preflight_job_name("gguf"), **{CONVERTERS_ENV: str(pinned.converters())})
    with gpu_jobs_seen(jobs) as gpu_jobs:
        jobs.create(
            "gguf", {**p40_job("tiny/alpaca.jsonl"), "output": {"pvc": {"claimName": "outputs"}, "formats": ["gguf"]}}
        )
        phases, _, _ = watch_until_done(jobs, "gguf", timeout=180)
    assert "gguf" not in gpu_jobs, gpu_jobs
    failed = jobs.condition("gguf", "Failed")
    said = (
        "spec.output.formats: gguf: llama.cpp's converter cannot convert this model's tokenizer: "
        "BPE pre-tokenizer was not recognized - update get_vocab_base_pre()"
    )
    assert (failed["reason"], failed["message"]) == ("InvalidConfig", said), failed
    assert phases == ["Pending", "Failed"], phases
    assert jobs.pods("gguf") == []


def test_a_wrong_held_out_path_fails_in_the_preflight_naming_its_claim_and_path(
    jobs: Jobs, training_volumes: dict[str, Path], operator: OperatorProcess
) -> None:
    """A separate held-out source (dataset.eval) is checked as the training data is, on its own
    mount of its claim (here the training data's claim, mounted a second time)."""
    held_out = {"pvc": {"claimName": "datasets", "path": "tiny/missing-eval.jsonl"}}
    spec = p40_job("tiny/alpaca.jsonl")
    spec["dataset"] = {**spec["dataset"], "eval": held_out}
    jobs.create("wrong-eval", spec)
    phases, _, status = watch_until_done(jobs, "wrong-eval", timeout=180)
    said = "spec.dataset.eval: claim 'datasets', path 'tiny/missing-eval.jsonl': no such file or folder"
    failed = jobs.condition("wrong-eval", "Failed")
    assert (failed["reason"], failed["message"]) == ("InvalidData", said), failed
    assert status["message"] == said and phases == ["Pending", "Failed"], (status, phases)
    assert jobs.pods("wrong-eval") == []  # no trainer pod: the check came first

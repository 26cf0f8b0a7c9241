"""End to end through the operator against a real S3-compatible store (MinIO's server, started for
the session beside the cluster): a job reads its tiny model and dataset from a bucket, trains on
the node agent's node and copies its outputs back to output.s3; a second job on the same model
fetches nothing (its fetch pod's log and the job's status say it reused the copy); and each
refusal fails the job in the pre-flight, one line naming the field, with no GPU Job ever made."""

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from finetune_api import contract
from finetune_api.object_storage import NAMESPACE_CACHE_CLAIM
from hack.cluster.object_store import ObjectStore
from tests.operator.test_e2e_preflight import gpu_jobs_seen
from tests.support.harness import Jobs, OperatorProcess, free_port
from tests.support.install import make_claim, wait_bound
from tests.support.specs import body
from tests.support.training import watch_until_done

pytestmark = [pytest.mark.cluster, pytest.mark.trainer]

MODEL = "models/tiny-llama/"
DATA = "data/alpaca.jsonl"
SECRET = "s3-credentials"
TRAINING = {"maxSteps": 4, "batchSize": 2, "gradientAccumulation": 1, "maxLength": 64}


@pytest.fixture(scope="module")
def bucket(s3: Any, tiny_assets: Path) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=name)
    model = tiny_assets / "model" / "tiny-llama"
    for path in sorted(model.rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), name, MODEL + path.relative_to(model).as_posix())
    s3.upload_file(str(tiny_assets / "data" / "tiny" / "alpaca.jsonl"), name, DATA)
    yield name


@pytest.fixture
def credentials(core: client.CoreV1Api, namespace: str, object_store: ObjectStore) -> str:
    """The Secret the jobs name, with the standard keys."""
    keys = {"AWS_ACCESS_KEY_ID": object_store.access_key, "AWS_SECRET_ACCESS_KEY": object_store.secret_key}
    core.create_namespaced_secret(namespace, {"metadata": {"name": SECRET}, "stringData": keys})
    wrong = {**keys, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    core.create_namespaced_secret(namespace, {"metadata": {"name": "wrong"}, "stringData": wrong})
    return SECRET


def source(store: ObjectStore, bucket: str, key: str, **extra: Any) -> dict[str, Any]:
    return {
        "pvc": None,
        "s3": {"bucket": bucket, "key": key, "endpoint": store.endpoint, "secretName": SECRET, **extra},
    }


def s3_spec(store: ObjectStore, bucket: str, **extra: Any) -> dict[str, Any]:
    return body(
        model={"source": source(store, bucket, MODEL)},
        dataset={"source": source(store, bucket, DATA), "format": "alpaca"},
        training=TRAINING,
        **extra,
    )


def fetch_log(core: client.CoreV1Api, namespace: str, job: str) -> str:
    (pod,) = core.list_namespaced_pod(namespace, label_selector=f"job-name={contract.fetch_job_name(job)}").items
    return str(core.read_namespaced_pod_log(pod.metadata.name, namespace, container=contract.CONTAINER))


def test_jobs_read_the_bucket_train_copy_back_and_a_second_reuses_the_copy(
    core: client.CoreV1Api,
    namespace: str,
    jobs: Jobs,
    operator: OperatorProcess,
    object_store: ObjectStore,
    bucket: str,
    s3: Any,
    credentials: str,
) -> None:
    make_claim(core, namespace, "outputs")
    wait_bound(core, namespace, "outputs")
    output = {"bucket": bucket, "key": f"results/{namespace}/", "endpoint": object_store.endpoint, "secretName": SECRET}
    jobs.create("first", s3_spec(object_store, bucket, output={"s3": output, "samples": {"count": 0}}))
    _, _, status = watch_until_done(jobs, "first", timeout=600)
    assert status["phase"] == "Succeeded", status
    inputs = {i["source"]: i for i in status["inputs"]}
    assert not inputs["model"]["reused"] and inputs["model"]["fetchedBytes"] == inputs["model"]["bytes"] > 0
    assert inputs["model"]["claimName"] == NAMESPACE_CACHE_CLAIM
    assert status["output"]["s3"] == f"s3://{bucket}/results/{namespace}/"
    stored = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"results/{namespace}/")["Contents"]}
    assert f"results/{namespace}/adapter/adapter_config.json" in stored, stored
    # The namespace's cache claim: made by the operator, owned by no job, kept for the next.
    claim = core.read_namespaced_persistent_volume_claim(NAMESPACE_CACHE_CLAIM, namespace)
    assert not claim.metadata.owner_references

    jobs.create("second", s3_spec(object_store, bucket, output={"samples": {"count": 0}}))
    _, _, status = watch_until_done(jobs, "second", timeout=600)
    assert status["phase"] == "Succeeded", status
    inputs = {i["source"]: i for i in status["inputs"]}
    assert inputs["model"]["reused"] and inputs["model"]["fetchedBytes"] == 0
    assert inputs["dataset"]["reused"]
    assert "reused the copy of s3://" in inputs["model"]["message"]
    assert f"model: reused the copy of s3://{bucket}/{MODEL}" in fetch_log(core, namespace, "second")


def test_each_refusal_fails_in_the_pre_flight_in_one_line_and_no_gpu_job_exists(
    core: client.CoreV1Api,
    namespace: str,
    jobs: Jobs,
    operator: OperatorProcess,
    object_store: ObjectStore,
    bucket: str,
    credentials: str,
) -> None:
    make_claim(core, namespace, "outputs")
    make_claim(core, namespace, "tiny-cache", size="1Ki")
    endpoint, closed = object_store.endpoint, f"http://127.0.0.1:{free_port()}"
    gpu = {"resources": {"gpus": 1, "gpuProduct": "Tesla-P40", "cpu": "1", "memory": "2Gi"}}
    cases = {
        "no-bucket": (
            {"model": {"source": source(object_store, "no-such-bucket", MODEL)}},
            f"spec.model.source.s3.bucket: no bucket 'no-such-bucket' at {endpoint}",
        ),
        "no-key": (
            {"dataset": {"source": source(object_store, bucket, "data/missing.jsonl"), "format": "alpaca"}},
            f"spec.dataset.source.s3.key: no object 'data/missing.jsonl' in bucket '{bucket}'",
        ),
        "wrong-credentials": (
            {"model": {"source": source(object_store, bucket, MODEL, secretName="wrong")}},
            f"spec.model.source.s3.secretName: {endpoint} refused the credentials of Secret 'wrong' "
            "(SignatureDoesNotMatch)",
        ),
        "closed-endpoint": (
            {"model": {"source": source(object_store, bucket, MODEL, endpoint=closed)}},
            f"spec.model.source.s3.endpoint: cannot reach {closed}: ",
        ),
        "too-large": (
            {"objectCache": {"claimName": "tiny-cache"}},
            "spec.objectCache.claimName: the objects to fetch (",
        ),
    }
    with gpu_jobs_seen(jobs) as gpu_jobs:
        for name, (change, _) in cases.items():
            spec = s3_spec(object_store, bucket, **gpu)
            for key, value in change.items():
                spec[key] = {**spec.get(key, {}), **value} if isinstance(value, dict) else value
            jobs.create(name, spec)
        for name in cases:
            jobs.wait_phase(name, "Failed", 180)
    assert gpu_jobs == set(), gpu_jobs
    for name, (_, said) in cases.items():
        failed = jobs.condition(name, "Failed")
        assert failed["reason"] == "InvalidConfig" and failed["message"].startswith(said), (name, failed)
        assert "\n" not in failed["message"]
        assert jobs.pods(name) == []
    too_large = jobs.condition("too-large", "Failed")["message"]
    assert too_large.endswith(
        "do not fit in the object cache claim 'tiny-cache' (1Ki): name a larger claim in spec.objectCache.claimName"
    ), too_large
    # Refused from the pre-flight's listing: no fetch Job was made for it.
    assert not [j for j in jobs.batch.list_namespaced_job(namespace).items if j.metadata.name == "too-large-fetch"]

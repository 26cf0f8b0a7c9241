"""S3 sources and output.s3 against a real S3-compatible store (MinIO's server, started for the
session by tests/fixtures/object_store.py), through the trainer's own commands as the pods run
them: the pre-flight's listing (`--check-inputs`), the fetch Job's (`--fetch-inputs`), and
`ftjob run`, which fetches, trains and copies the outputs back.

What the issue asks of them: a copy whose ETags match is reused (nothing fetched, and said so);
a fetch killed half-way through an object continues where it stopped; every refusal (a missing
bucket or key, refused credentials, an endpoint that refuses connections, objects larger than
the cache claim) is one line naming the field, before anything is fetched, from the pre-flight and
from `ftjob run` alike; the fingerprint records the objects' ETags.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from finetune_api.contract import CHECK_INPUTS_FLAG, FETCH_INPUTS_FLAG, FETCHED_PREFIX, LISTED_PREFIX, said_after
from finetune_api.object_storage import NAMESPACE_CACHE_CLAIM
from finetune_api.reasons import ExitReason
from hack.cluster.object_store import ObjectStore
from tests.support.cli import ftjob_process
from tests.support.faults import faults_env
from tests.support.harness import free_port
from tests.trainer.conftest import JobDir

pytestmark = pytest.mark.trainer

MODEL = "models/tiny-llama/"
DATA = "data/alpaca.jsonl"
BIG = "data/big.jsonl"


@pytest.fixture(scope="module")
def bucket(s3: Any, tiny_assets: Path) -> Iterator[str]:
    """A bucket of its own holding the tiny model (a prefix), its dataset and a larger dataset."""
    name = f"tiny-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=name)
    for path in sorted((tiny_assets / "models" / "tiny-llama").rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), name, MODEL + path.relative_to(tiny_assets / "models" / "tiny-llama").as_posix())
    alpaca = (tiny_assets / "datasets" / "alpaca.jsonl").read_bytes()
    s3.put_object(Bucket=name, Key=DATA, Body=alpaca)
    # About 1.5 MB: a few dozen of the test's small ranged GETs, so a kill lands inside it.
    s3.put_object(Bucket=name, Key=BIG, Body=alpaca * (1_500_000 // len(alpaca) + 1))
    yield name


def s3_source(store: ObjectStore, bucket: str, key: str, **extra: Any) -> dict[str, Any]:
    return {"pvc": None, "s3": {"bucket": bucket, "key": key, "endpoint": store.endpoint, **extra}}


def s3_job(job_dir: JobDir, store: ObjectStore, bucket: str, data: str = DATA, **extra: Any) -> JobDir:
    job_dir.spec_changes = {
        "model": {"source": s3_source(store, bucket, MODEL, **extra)},
        "dataset": {"source": s3_source(store, bucket, data, **extra)},
    }
    return job_dir


def credentials(store: ObjectStore, secret: str | None = None) -> dict[str, str]:
    """The usual variables, as `ftjob run` reads them (and a pod gets them from its Secret)."""
    return {"AWS_ACCESS_KEY_ID": store.access_key, "AWS_SECRET_ACCESS_KEY": secret or store.secret_key}


def trainer(job: JobDir, flag: str, env: dict[str, str]) -> tuple[int, str, str, float]:
    """(exit code, termination message, stderr, seconds) of one run of the trainer's command."""
    termination = job.root / "termination-log"
    termination.unlink(missing_ok=True)
    command = [sys.executable, "-m", "finetune_trainer", "--config", str(job.config_path()), flag]
    started = time.monotonic()
    done = subprocess.run(
        [*command, "--termination-log", str(termination)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **env},
    )
    said = termination.read_text(encoding="utf-8") if termination.exists() else ""
    return done.returncode, said, done.stderr, time.monotonic() - started


def fetched(said: str) -> dict[str, dict[str, Any]]:
    copies = said_after(FETCHED_PREFIX, said)
    assert isinstance(copies, list), said
    return {c["source"]: c for c in copies}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def copy_of(job: JobDir, store: ObjectStore, bucket: str, key: str) -> Path:
    host = store.endpoint.split("://", 1)[1]
    return job.root / NAMESPACE_CACHE_CLAIM / host / bucket / key


def test_the_pre_flight_lists_the_bytes_and_fetches_nothing(
    job_dir: JobDir, object_store: ObjectStore, bucket: str, s3: Any
) -> None:
    job = s3_job(job_dir, object_store, bucket)
    code, said, stderr, _ = trainer(job, CHECK_INPUTS_FLAG, credentials(object_store))
    assert code == 0, said + stderr[-2000:]
    listed = said_after(LISTED_PREFIX, said)
    assert isinstance(listed, dict), said
    model = s3.list_objects_v2(Bucket=bucket, Prefix=MODEL)["Contents"]
    data = s3.head_object(Bucket=bucket, Key=DATA)["ContentLength"]
    assert listed["sources"]["model"] == {
        "uri": f"s3://{bucket}/{MODEL}",
        "objects": len(model),
        "bytes": sum(o["Size"] for o in model),
    }
    assert listed["bytes"] == sum(o["Size"] for o in model) + data
    assert not (job.root / NAMESPACE_CACHE_CLAIM).exists()


def test_a_second_fetch_reuses_the_copy_and_a_changed_object_is_fetched_alone(
    job_dir: JobDir, object_store: ObjectStore, bucket: str, s3: Any, tiny_assets: Path
) -> None:
    from finetune_trainer.state.fingerprint import DATASET_OBJECTS, MODEL_OBJECTS, fingerprint

    job = s3_job(job_dir, object_store, bucket)
    code, said, stderr, _ = trainer(job, FETCH_INPUTS_FLAG, credentials(object_store))
    assert code == 0, said + stderr[-2000:]
    first = fetched(said)
    assert not first["model"]["reused"] and first["model"]["fetchedBytes"] == first["model"]["bytes"] > 0
    source = tiny_assets / "models" / "tiny-llama"
    for path in source.rglob("*"):
        if path.is_file():
            assert digest(copy_of(job, object_store, bucket, MODEL) / path.relative_to(source)) == digest(path)
    config = job.config_path()
    from finetune_api.trainer_config import TrainerConfig

    loaded = TrainerConfig.model_validate_json(config.read_text())
    before = fingerprint(loaded, 1)
    assert before[MODEL_OBJECTS].startswith(f"{first['model']['objects']} objects, ") and DATASET_OBJECTS in before

    code, said, stderr, _ = trainer(job, FETCH_INPUTS_FLAG, credentials(object_store))
    assert code == 0, said
    second = fetched(said)
    assert second["model"]["reused"] and second["model"]["fetchedBytes"] == 0
    assert second["dataset"]["reused"]
    assert "reused the copy of s3://" in second["model"]["message"] and "nothing fetched" in stderr

    # The dataset replaced in the store: a new ETag, fetched again alone; the fingerprint moves.
    s3.put_object(Bucket=bucket, Key=DATA, Body=(tiny_assets / "datasets" / "alpaca.jsonl").read_bytes() + b"\n")
    try:
        code, said, _, _ = trainer(job, FETCH_INPUTS_FLAG, credentials(object_store))
        third = fetched(said)
        assert code == 0 and third["model"]["reused"] and not third["dataset"]["reused"], said
        after = fingerprint(loaded, 1)
        assert after[MODEL_OBJECTS] == before[MODEL_OBJECTS] and after[DATASET_OBJECTS] != before[DATASET_OBJECTS]
    finally:
        s3.put_object(Bucket=bucket, Key=DATA, Body=(tiny_assets / "datasets" / "alpaca.jsonl").read_bytes())


def test_a_fetch_killed_half_way_through_an_object_resumes_where_it_stopped(
    job_dir: JobDir, object_store: ObjectStore, bucket: str, s3: Any
) -> None:
    job = s3_job(job_dir, object_store, bucket, data=BIG)
    size = s3.head_object(Bucket=bucket, Key=BIG)["ContentLength"]
    slow = {
        **credentials(object_store),
        **faults_env(FINETUNE_TEST_FETCH_CHUNK=str(64 << 10), FINETUNE_TEST_FETCH_DELAY="0.1"),
    }
    command = [sys.executable, "-m", "finetune_trainer", "--config", str(job.config_path()), FETCH_INPUTS_FLAG]
    process = subprocess.Popen(command, env={**os.environ, **slow}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    partial = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        partial = next(
            (p for p in (job.root / NAMESPACE_CACHE_CLAIM).rglob("big.jsonl") if ".finetune" in p.parts), None
        )
        if partial is not None and partial.stat().st_size >= size // 4:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)  # the fetch, killed for real, mid-object
    process.wait(30)
    assert partial is not None and size // 4 <= partial.stat().st_size < size, "the kill did not land inside the object"
    kept = partial.stat().st_size
    assert not copy_of(job, object_store, bucket, BIG).exists()

    code, said, stderr, _ = trainer(job, FETCH_INPUTS_FLAG, credentials(object_store))
    assert code == 0, said + stderr[-2000:]
    data = fetched(said)["dataset"]
    assert data["fetchedBytes"] == size - kept, data
    assert f"resuming {BIG} at {kept} of {size} bytes" in stderr
    body = s3.get_object(Bucket=bucket, Key=BIG)["Body"].read()
    assert digest(copy_of(job, object_store, bucket, BIG)) == hashlib.sha256(body).hexdigest()


REFUSALS = {
    "missing-bucket": (
        {"model": {"bucket": "no-such-bucket"}},
        {},
        "spec.model.source.s3.bucket: no bucket 'no-such-bucket' at {endpoint}",
    ),
    "missing-key": (
        {"dataset": {"key": "data/missing.jsonl"}},
        {},
        "spec.dataset.source.s3.key: no object 'data/missing.jsonl' in bucket '{bucket}'",
    ),
    "empty-prefix": (
        {"model": {"key": "models/none/"}},
        {},
        "spec.model.source.s3.key: no objects under prefix 'models/none/' in bucket '{bucket}'",
    ),
    "wrong-credentials": (
        {"model": {"secretName": "s3-credentials"}, "dataset": {"secretName": "s3-credentials"}},
        {"AWS_SECRET_ACCESS_KEY": "not-the-secret"},
        "spec.model.source.s3.secretName: {endpoint} refused the credentials of Secret 's3-credentials' "
        "(SignatureDoesNotMatch)",
    ),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_each_refusal_in_the_pre_flight_is_one_line_naming_the_field(
    job_dir: JobDir, object_store: ObjectStore, bucket: str, case: str
) -> None:
    changes, env, text = REFUSALS[case]
    job = s3_job(job_dir, object_store, bucket)
    for role, change in changes.items():
        job.spec_changes[role]["source"]["s3"].update(change)
    code, said, _, _ = trainer(job, CHECK_INPUTS_FLAG, {**credentials(object_store), **env})
    assert code == ExitReason.InvalidConfig
    assert said == "InvalidConfig: " + text.format(endpoint=object_store.endpoint, bucket=bucket)


def test_an_endpoint_that_refuses_connections_is_said_in_seconds(
    job_dir: JobDir, object_store: ObjectStore, bucket: str
) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    job_dir.spec_changes = {
        "model": {"source": {"pvc": None, "s3": {"bucket": bucket, "key": MODEL, "endpoint": closed}}}
    }
    code, said, _, seconds = trainer(job_dir, CHECK_INPUTS_FLAG, credentials(object_store))
    assert code == ExitReason.InvalidConfig
    assert said.startswith(f"InvalidConfig: spec.model.source.s3.endpoint: cannot reach {closed}: "), said
    assert "\n" not in said.strip()
    assert seconds < 30, f"{seconds:.1f} s to say the endpoint refuses connections"


def test_objects_larger_than_the_cache_claim_are_refused_before_a_byte_is_fetched(
    job_dir: JobDir, object_store: ObjectStore, bucket: str
) -> None:
    job = s3_job(job_dir, object_store, bucket)
    small = {**credentials(object_store), "FINETUNE_OBJECT_CACHE_SIZE": "100Ki"}
    code, said, _, _ = trainer(job, FETCH_INPUTS_FLAG, small)
    assert code == ExitReason.InvalidConfig
    assert said.startswith("InvalidConfig: spec.model.source.s3: the objects to fetch ("), said
    assert f"do not fit in the object cache claim '{NAMESPACE_CACHE_CLAIM}' (" in said
    assert said.endswith("free): name a larger claim in spec.objectCache.claimName")
    assert not [p for p in (job.root / NAMESPACE_CACHE_CLAIM).rglob("*") if p.is_file() and ".finetune" not in p.parts]


def test_ftjob_run_fetches_trains_and_copies_the_outputs_to_the_bucket(
    job_dir: JobDir, object_store: ObjectStore, bucket: str, s3: Any
) -> None:
    job = s3_job(job_dir, object_store, bucket)
    output = {"bucket": bucket, "key": "results/tiny/", "endpoint": object_store.endpoint}
    job.spec_changes.update(
        training={"maxSteps": 4, "batchSize": 2, "maxLength": 64},
        checkpoints={"everySteps": 2},
        output={"s3": output, "samples": {"count": 0}},
    )
    done = ftjob_process(
        "run", str(job.manifest()), "--workdir", str(job.root), env=credentials(object_store), timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "model: fetched " in done.stdout and f"of s3://{bucket}/{MODEL}" in done.stdout
    stored = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="results/tiny/").get("Contents", [])}
    assert "results/tiny/adapter/adapter_config.json" in stored and "results/tiny/summary.json" in stored, stored
    assert not [k for k in stored if "/checkpoints/" in k], "checkpoints stay on the claim"
    local = job.output / "adapter" / "adapter_config.json"
    copied = s3.get_object(Bucket=bucket, Key="results/tiny/adapter/adapter_config.json")["Body"].read()
    assert copied == local.read_bytes()
    summary = json.loads(s3.get_object(Bucket=bucket, Key="results/tiny/summary.json")["Body"].read())
    assert summary["finalStep"] == 4


# `ftjob run`'s refusals: the same lines as the pre-flight's, its credentials the usual variables
# (no Secret named). FINETUNE_OBJECT_CACHE_SIZE is how the fetch learns its claim's size (the
# operator sets it on the fetch Job); here it stands for a small cache folder. Each is a process
# of its own (ftjob_process), as a user runs it: no traceback may reach its stderr.
RUN_REFUSALS = {
    "missing-bucket": (
        {"model": {"bucket": "no-such-bucket"}},
        {},
        "spec.model.source.s3.bucket: no bucket 'no-such-bucket' at {endpoint}",
    ),
    "missing-key": (
        {"dataset": {"key": "data/missing.jsonl"}},
        {},
        "spec.dataset.source.s3.key: no object 'data/missing.jsonl' in bucket '{bucket}'",
    ),
    "wrong-credentials": (
        {},
        {"AWS_SECRET_ACCESS_KEY": "not-the-secret"},
        "spec.model.source.s3.secretName: {endpoint} refused the credentials found in the environment "
        "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) (SignatureDoesNotMatch)",
    ),
    "closed-endpoint": (
        {"model": {"endpoint": "{closed}"}},
        {},
        "spec.model.source.s3.endpoint: cannot reach {closed}: Could not connect to the endpoint URL",
    ),
    "too-large": (
        {},
        {"FINETUNE_OBJECT_CACHE_SIZE": "100Ki"},
        "spec.model.source.s3: the objects to fetch (",
    ),
}


@pytest.mark.parametrize("case", RUN_REFUSALS)
def test_ftjob_run_refuses_each_in_one_line_before_training(
    job_dir: JobDir, object_store: ObjectStore, bucket: str, case: str
) -> None:
    changes, env, text = RUN_REFUSALS[case]
    words = {"endpoint": object_store.endpoint, "bucket": bucket, "closed": f"http://127.0.0.1:{free_port()}"}
    job = s3_job(job_dir, object_store, bucket)
    for role, change in changes.items():
        job.spec_changes[role]["source"]["s3"].update({k: v.format(**words) for k, v in change.items()})
    done = ftjob_process(
        "run", str(job.manifest()), "--workdir", str(job.root), env={**credentials(object_store), **env}, timeout=300
    )
    assert done.returncode == ExitReason.InvalidConfig, done.stdout[-2000:] + done.stderr[-2000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("failed (exit 10): ")]
    assert line.startswith("failed (exit 10): InvalidConfig: " + text.format(**words)), line
    assert "Traceback" not in done.stdout + done.stderr
    assert not (job.output / "adapter").exists(), "no training after a refusal"
    cache = job.root / NAMESPACE_CACHE_CLAIM
    assert not [p for p in cache.rglob("*") if p.is_file() and ".finetune" not in p.parts], "nothing fetched"

"""A job with S3 sources: the pre-flight lists them, the operator makes (or reads) the object cache
claim and the fetch Job, and only once the fetch passed the GPU Job; the shapes the builders give
each pod (who gets which credentials, which claim read-write, which may reach a store)."""

import json
from typing import Any

from finetune_api import contract
from finetune_api.object_storage import NAMESPACE_CACHE_CLAIM
from finetune_operator.builders import job as job_builder
from finetune_operator.builders import network
from finetune_operator.builders import objects as objects_builder
from finetune_operator.builders import preflight as preflight_builder
from finetune_operator.children import OBJECT_EGRESS_LABEL
from finetune_operator.decide import decide
from finetune_operator.setting_parsers import TrainerNetwork
from tests.operator.test_decide import OWNER, batch_job, checked_inputs, finetunejob, seen
from tests.support.specs import SETTINGS
from tests.support.specs import spec as make_spec

ENDPOINT = "http://minio.storage:9000"
S3_MODEL = {"s3": {"bucket": "models", "key": "tiny-llama/", "endpoint": ENDPOINT, "secretName": "s3-models"}}
S3_DATA = {"s3": {"bucket": "data", "key": "tiny/alpaca.jsonl", "endpoint": ENDPOINT, "secretName": "s3-data"}}
OBJECTS = {"model": {"source": S3_MODEL}, "dataset": {"source": S3_DATA, "format": "alpaca"}}
LISTED = contract.LISTED_PREFIX + json.dumps({"bytes": 3 << 30, "sources": {}})


def _pod(owner_uid: str, phase: str, message: str) -> dict[str, Any]:
    state = {"terminated": {"exitCode": 0 if phase == "Succeeded" else 10, "message": message}}
    return {
        "metadata": {"name": f"pod-{owner_uid}", "ownerReferences": [{"kind": "Job", "uid": owner_uid}]},
        "status": {"phase": phase, "containerStatuses": [{"name": contract.CONTAINER, "state": state}]},
    }


def _job(name: str, uid: str, state: str | None) -> dict[str, Any]:
    job = checked_inputs()
    job["metadata"].update(name=name, uid=uid)
    job["status"] = {"conditions": [{"type": state, "status": "True"}]} if state else {}
    return job


def _env(job: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


def _claims(job: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """mount path: (claim, read-only) of each claim the pod mounts."""
    pod = job["spec"]["template"]["spec"]
    volumes = {v["name"]: v["persistentVolumeClaim"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    return {
        m["mountPath"]: (volumes[m["name"]]["claimName"], bool(volumes[m["name"]].get("readOnly")))
        for m in pod["containers"][0]["volumeMounts"]
        if m["name"] in volumes
    }


def test_the_pre_flight_lists_with_each_sources_credentials_by_reference_and_mounts_no_cache() -> None:
    spec = make_spec(**OBJECTS)
    assert preflight_builder.needed(spec, SETTINGS)
    check = preflight_builder.preflight_job(OWNER, spec, SETTINGS)
    env = _env(check)
    ref = {"secretKeyRef": {"name": "s3-models", "key": "AWS_ACCESS_KEY_ID"}}
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"] == ref
    assert env["DATASET_AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "s3-data",
        "key": "AWS_SECRET_ACCESS_KEY",
    }
    assert check["spec"]["template"]["metadata"]["labels"][OBJECT_EGRESS_LABEL] == "true"
    assert contract.OBJECTS_MOUNT not in _claims(check)


def test_a_listed_job_reads_the_cache_claim_then_makes_it_and_the_fetch_job() -> None:
    listed = [_pod("preflight-uid", "Succeeded", LISTED)]
    first = decide(seen(finetunejob(PENDING_STATUS, **OBJECTS), pods=listed))
    assert first.read_claim == NAMESPACE_CACHE_CLAIM and first.create == () and first.fetch == ()
    made = decide(seen(finetunejob(PENDING_STATUS, **OBJECTS), pods=listed, claim_read=True, cache_claim=None))
    claim, fetch = made.fetch
    assert claim["kind"] == "PersistentVolumeClaim" and claim["metadata"]["name"] == NAMESPACE_CACHE_CLAIM
    assert "ownerReferences" not in claim["metadata"]  # the namespace's, outliving each job
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"  # 3 GiB x 1.5, below the least
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert fetch["metadata"]["name"] == "tiny-fetch" and made.create == ()
    container = fetch["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == list(contract.FETCH_COMMAND)
    assert _claims(fetch)[contract.OBJECTS_MOUNT] == (NAMESPACE_CACHE_CLAIM, False)
    assert _env(fetch)[contract.OBJECT_CACHE_SIZE_ENV]["value"] == "10Gi"
    assert not fetch["spec"]["template"]["spec"]["automountServiceAccountToken"]


def test_the_claim_size_follows_the_listed_bytes() -> None:
    assert objects_builder.claim_size(141 * 10**9, "10Gi") == "197Gi"
    assert objects_builder.claim_size(1, "10Gi") == "10Gi"


def test_a_named_claim_that_is_missing_or_too_small_fails_the_job_before_any_fetch() -> None:
    named = {**OBJECTS, "objectCache": {"claimName": "my-cache"}}
    listed = [_pod("preflight-uid", "Succeeded", LISTED)]
    missing = decide(seen(finetunejob(PENDING_STATUS, **named), pods=listed, claim_read=True, cache_claim=None))
    assert missing.fetch == () and missing.status_patch is not None
    assert missing.status_patch["message"] == "spec.objectCache.claimName: no claim 'my-cache' in the namespace"
    small = {"metadata": {"name": "my-cache"}, "spec": {"resources": {"requests": {"storage": "1Gi"}}}}
    refused = decide(seen(finetunejob(PENDING_STATUS, **named), pods=listed, claim_read=True, cache_claim=small))
    assert refused.fetch == () and refused.status_patch is not None and refused.status_patch["phase"] == "Failed"
    assert refused.status_patch["message"] == (
        "spec.objectCache.claimName: the objects to fetch (3.22 GB) do not fit in the object cache claim "
        "'my-cache' (1Gi): name a larger claim in spec.objectCache.claimName"
    )


def test_the_gpu_job_comes_only_after_the_fetch_passed_and_says_what_it_fetched() -> None:
    listed = _pod("preflight-uid", "Succeeded", LISTED)
    fetching = decide(
        seen(finetunejob(PENDING_STATUS, **OBJECTS), fetch=_job("tiny-fetch", "fetch-uid", None), pods=[listed])
    )
    assert fetching.create == () and fetching.status_patch is not None
    assert fetching.status_patch["message"].startswith(
        "fetching inputs: Job tiny-fetch fetches s3://models/tiny-llama/"
    )
    copies = [{"source": "model", "uri": "s3://models/tiny-llama/", "reused": True, "fetchedBytes": 0, "message": "m"}]
    passed = _pod("fetch-uid", "Succeeded", contract.FETCHED_PREFIX + json.dumps(copies))
    done = decide(
        seen(
            finetunejob(PENDING_STATUS, **OBJECTS),
            fetch=_job("tiny-fetch", "fetch-uid", "Complete"),
            pods=[listed, passed],
        )
    )
    assert [c["kind"] for c in done.create][-1] == "Job"
    gpu = done.create[-1]
    assert _claims(gpu)[contract.OBJECTS_MOUNT] == (NAMESPACE_CACHE_CLAIM, True)
    assert not [e for e in _env(gpu).values() if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]]
    assert OBJECT_EGRESS_LABEL not in gpu["spec"]["template"]["metadata"]["labels"]
    # The next pass writes the status: status.inputs says the copy was reused.
    running = decide(seen(finetunejob(PENDING_STATUS, **OBJECTS), job=batch_job(), pods=[listed, passed]))
    assert running.status_patch is not None and running.status_patch["inputs"][0]["reused"] is True


def test_a_failed_fetch_fails_the_job_with_its_one_line() -> None:
    listed = _pod("preflight-uid", "Succeeded", LISTED)
    line = "InvalidConfig: spec.model.source.s3.secretName: http://minio.storage:9000 refused the credentials"
    failed = _pod("fetch-uid", "Failed", line)
    actions = decide(
        seen(
            finetunejob(PENDING_STATUS, **OBJECTS),
            fetch=_job("tiny-fetch", "fetch-uid", "Failed"),
            pods=[listed, failed],
        )
    )
    assert actions.create == () and actions.status_patch is not None
    assert actions.status_patch["phase"] == "Failed"
    assert actions.status_patch["message"] == line.removeprefix("InvalidConfig: ")


def test_only_a_job_with_output_s3_gives_its_trainer_the_outputs_credentials_and_a_route() -> None:
    spec = make_spec(output={"s3": {"bucket": "results", "key": "tiny/", "endpoint": ENDPOINT, "secretName": "out"}})
    gpu = job_builder.job(OWNER, spec, SETTINGS)
    env = _env(gpu)
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "out", "key": "AWS_SECRET_ACCESS_KEY"}
    assert gpu["spec"]["template"]["metadata"]["labels"][OBJECT_EGRESS_LABEL] == "true"
    assert set(env) <= job_builder.ENV_NAMES


def test_the_objects_policy_lets_only_the_labelled_pods_reach_the_stores() -> None:
    store = {"to": [{"ipBlock": {"cidr": "10.0.5.10/32"}}], "ports": [{"protocol": "TCP", "port": 9000}]}
    rules = TrainerNetwork(egress=({"to": []},), hub_egress=None, peer_ports=(), object_egress=(store,))
    policies = {p["metadata"]["name"]: p for p in network.namespace_policies("team-a", rules)}
    objects = policies[network.OBJECT_TRAINERS]["spec"]
    assert objects["podSelector"]["matchLabels"][OBJECT_EGRESS_LABEL] == "true"
    assert objects["egress"] == [store] and objects["ingress"] == []
    none = TrainerNetwork(egress=({"to": []},), hub_egress=None, peer_ports=())
    assert network.OBJECT_TRAINERS not in {p["metadata"]["name"] for p in network.namespace_policies("t", none)}


def test_the_trainer_reads_each_source_from_its_copy_on_the_cache_claim() -> None:
    spec = make_spec(**OBJECTS)
    found = contract.trainer_paths("tiny", spec, lambda role, claim: f"/mnt/{role}", "/cache")
    assert found["model"] == "/mnt/objects/minio.storage:9000/models/tiny-llama"
    assert found["dataset"] == "/mnt/objects/minio.storage:9000/data/tiny/alpaca.jsonl"
    assert found["objects"] == "/mnt/objects"


PENDING_STATUS = {"phase": "Pending", "observedGeneration": 1}

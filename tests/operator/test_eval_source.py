"""A separate held-out source (spec.dataset.eval) reaches the pods as the training data does: a
claim of its own mounted read-only at EVAL_MOUNT in the pre-flight and the trainer, its S3 copy
fetched onto the object cache claim with its own credentials, a Hub token of its own; and a
message naming its in-pod path names the claim and path the user wrote."""

from typing import Any

from finetune_api import contract
from finetune_operator.builders import config
from finetune_operator.builders import job as job_builder
from finetune_operator.builders import objects as objects_builder
from finetune_operator.builders import preflight as preflight_builder
from finetune_operator.fetch_stage import fetching_message
from tests.support.specs import OWNER, SETTINGS
from tests.support.specs import spec as make_spec

ENDPOINT = "http://minio.storage:9000"
EVAL_PVC = {"pvc": {"claimName": "evals", "path": "tiny/eval.jsonl"}}
HUB_DATA = {"hub": {"id": "org/data"}}


def _container(built: dict[str, Any]) -> dict[str, Any]:
    return dict(built["spec"]["template"]["spec"]["containers"][0])


def _claims(built: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """mount path -> (volume, claim) of the pod's claims."""
    volumes = {v["name"]: v for v in built["spec"]["template"]["spec"]["volumes"]}
    return {
        m["mountPath"]: (m["name"], volumes[m["name"]]["persistentVolumeClaim"]["claimName"])
        for m in _container(built)["volumeMounts"]
        if "persistentVolumeClaim" in volumes[m["name"]]
    }


def _s3(key: str, secret: str) -> dict[str, Any]:
    return {"s3": {"bucket": "data", "key": key, "endpoint": ENDPOINT, "secretName": secret}}


def test_an_eval_claim_is_mounted_read_only_in_the_preflight_and_the_trainer_and_read_there() -> None:
    spec = make_spec(dataset={"eval": EVAL_PVC})
    assert config.trainer_config(OWNER, spec).paths.eval_dataset == f"{contract.EVAL_MOUNT}/tiny/eval.jsonl"
    for built in (job_builder.job(OWNER, spec, SETTINGS), preflight_builder.preflight_job(OWNER, spec, SETTINGS)):
        assert _claims(built)[contract.EVAL_MOUNT] == ("eval", "evals")
        mount = next(m for m in _container(built)["volumeMounts"] if m["mountPath"] == contract.EVAL_MOUNT)
        assert mount["readOnly"] is True
    # Hub model and data, the held-out file on a claim: the pre-flight still has a claim to check.
    hub_only = make_spec(model={"source": {"hub": {"id": "org/tiny"}}}, dataset={"source": HUB_DATA})
    assert not preflight_builder.needed(hub_only, SETTINGS)
    held_out = make_spec(model={"source": {"hub": {"id": "org/tiny"}}}, dataset={"source": HUB_DATA, "eval": EVAL_PVC})
    assert preflight_builder.needed(held_out, SETTINGS)


def test_without_an_eval_source_nothing_changes() -> None:
    spec = make_spec(dataset={"evalFraction": 0.1})
    assert config.trainer_config(OWNER, spec).paths.eval_dataset is None
    assert contract.EVAL_MOUNT not in _claims(job_builder.job(OWNER, spec, SETTINGS))
    assert spec.dataset.held_out and not make_spec().dataset.held_out


def test_a_preflight_message_names_the_eval_claim_and_path_as_the_user_wrote_them() -> None:
    spec = make_spec(dataset={"eval": EVAL_PVC})
    said = contract.on_claims(f"spec.dataset.eval: {contract.EVAL_MOUNT}/tiny/eval.jsonl: no such file", spec)
    assert said == "spec.dataset.eval: claim 'evals', path 'tiny/eval.jsonl': no such file"


def test_an_s3_eval_source_is_fetched_with_its_own_credentials_and_read_from_its_copy() -> None:
    spec = make_spec(dataset={"source": _s3("train.jsonl", "s3-data"), "eval": _s3("eval.jsonl", "s3-eval")})
    assert contract.uses_objects(make_spec(dataset={"eval": _s3("eval.jsonl", "s3-eval")}))
    paths = config.trainer_config(OWNER, spec).paths
    assert paths.eval_dataset == f"{contract.OBJECTS_MOUNT}/minio.storage:9000/data/eval.jsonl"
    fetch = objects_builder.fetch_job(OWNER, spec, SETTINGS, "10Gi")
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
        for e in _container(fetch)["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    # The first Secret takes the plain names, the held-out source's (a second one) its own prefix.
    assert refs == {
        **dict.fromkeys(contract.S3_KEY_ENV, "s3-data"),
        **dict.fromkeys(contract.EVAL_S3_KEY_ENV, "s3-eval"),
    }
    assert "s3://data/eval.jsonl" in fetching_message("tiny", spec)
    # One Secret for both: one set of variables, which the eval role shares.
    shared = make_spec(dataset={"source": _s3("train.jsonl", "s3-data"), "eval": _s3("eval.jsonl", "s3-data")})
    assert [prefix for _, prefix, _ in contract.s3_secrets(shared, contract.S3_INPUT_ROLES)] == ["", ""]


def test_a_hub_eval_source_gets_its_token_from_its_own_secret_or_shares_one() -> None:
    def hub(secret: str) -> dict[str, Any]:
        return {"hub": {"id": "org/held-out", "split": "test", "tokenSecret": secret}}

    spec = make_spec(dataset={"source": {"hub": {"id": "org/data", "tokenSecret": "data"}}, "eval": hub("held")})
    trainer = _container(job_builder.job(OWNER, spec, SETTINGS))
    env = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
        for e in trainer["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert env == {contract.HUB_TOKEN_ENV: "data", contract.EVAL_HUB_TOKEN_ENV: "held"}
    assert contract.hub_token_env(spec, "eval") == contract.EVAL_HUB_TOKEN_ENV
    assert config.trainer_config(OWNER, spec).paths.eval_dataset == "org/held-out"
    shared = make_spec(dataset={"source": {"hub": {"id": "org/data", "tokenSecret": "data"}}, "eval": hub("data")})
    assert contract.hub_token_env(shared, "eval") == contract.hub_token_env(shared, "dataset") == contract.HUB_TOKEN_ENV

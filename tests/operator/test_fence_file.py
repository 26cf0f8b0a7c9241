"""The operator fence's Job rules hold exactly what the builders write: the trainer's command,
the folders it mounts, the environment's names, the Hub token's variables and key, and the
namespaces the operator never writes in. Each is written once in Python (finetune_api.contract,
builders/job.py, builders/multinode.py, settings.py) and once as a CEL literal in
charts/finetune-operator/files/operator-fence-policy.yaml; these tests hold the two together,
and the builders' Jobs for every kind of job to the Python side."""

import json
from typing import Any

import pytest
import yaml

from finetune_api import contract
from finetune_api.spec import FineTuneJobSpec
from finetune_operator.builders import job, multinode, objects, preflight
from finetune_operator.setting_parsers import SYSTEM_NAMESPACES
from finetune_operator.settings import Settings
from tests.support.harness import FENCE_POLICY_FILE, SYSTEM_NAMESPACE
from tests.support.specs import OWNER, SETTINGS, body, gpu_spec


def _source_policy(name: str) -> dict[str, Any]:
    (policy,) = [p for p in yaml.safe_load(FENCE_POLICY_FILE.read_text()) if p["metadata"]["name"] == name]
    return dict(policy)


def _literal(policy: dict[str, Any], name: str) -> Any:
    (found,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == name]
    return json.loads(found)


JOBS = _source_policy("finetune-fence-jobs")
HUB_TOKEN = {"hub": {"id": "org/private", "tokenSecret": "hub-token"}}
HUB_SETTINGS = Settings(
    trainer_image=SETTINGS.trainer_image,
    hub_env={"HF_ENDPOINT": "https://hub.internal.example", "HTTPS_PROXY": "http://10.0.0.20:3128"},
)

# One of each kind of Job the operator makes: one node on claims, Hub sources with tokens (model,
# dataset and held-out source from different Secrets), several nodes, a Kueue-queued job, a Pascal
# GPU job, a held-out source on a claim of its own.
KINDS: dict[str, dict[str, Any]] = {
    "claims": body(),
    "hub-tokens": body(
        model={"source": HUB_TOKEN},
        dataset={
            "source": {"hub": {"id": "org/data", "tokenSecret": "data-token"}},
            "eval": {"hub": {"id": "org/held-out", "tokenSecret": "eval-token", "split": "test"}},
            "format": "alpaca",
        },
    ),
    "multinode": {**gpu_spec(), "resources": {"gpus": 4, "nodes": 2, "cpu": "2", "memory": "8Gi"}},
    "kueue": body(placement={"queueName": "team-a"}),
    "pascal": gpu_spec(),
    "held-out": body(dataset={"eval": {"pvc": {"claimName": "evals", "path": "tiny/eval.jsonl"}}}),
}


def _jobs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for kind, spec_body in KINDS.items():
        spec = FineTuneJobSpec.model_validate(spec_body)
        for settings in (SETTINGS, HUB_SETTINGS):
            out.append((kind, multinode.indexed_job(OWNER, spec, settings)))
    return out


def _container(built: dict[str, Any]) -> dict[str, Any]:
    (container,) = built["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_the_fence_pins_the_trainers_command_from_the_contract() -> None:
    assert _literal(JOBS, "trainerCommand") == list(contract.TRAINER_COMMAND)
    for kind, built in _jobs():
        container = _container(built)
        assert container["command"] == list(contract.TRAINER_COMMAND) and "args" not in container, kind
        assert "workingDir" not in container and not built["spec"]["template"]["spec"].get("initContainers"), kind


def test_the_fence_admits_the_folders_the_builders_mount_and_no_other() -> None:
    assert _literal(JOBS, "mountPaths") == list(contract.MOUNT_PATHS)
    for kind, built in _jobs():
        assert {m["mountPath"] for m in _container(built)["volumeMounts"]} <= set(contract.MOUNT_PATHS), kind


S3 = {"bucket": "bucket", "endpoint": "http://store:9000"}
S3_KIND = body(
    model={"source": {"pvc": None, "s3": {**S3, "key": "m/", "secretName": "models"}}},
    dataset={
        "source": {"pvc": None, "s3": {**S3, "key": "d.jsonl", "secretName": "data"}},
        "eval": {"s3": {**S3, "key": "e.jsonl", "secretName": "evals"}},
        "format": "alpaca",
    },
    output={"s3": {**S3, "key": "out/", "secretName": "out"}},
)


def _s3_jobs() -> list[tuple[str, dict[str, Any]]]:
    """A job reading S3 and copying to it: its pre-flight, its fetch and its trainer."""
    spec = FineTuneJobSpec.model_validate(S3_KIND)
    return [
        ("s3-preflight", preflight.preflight_job(OWNER, spec, SETTINGS)),
        ("s3-fetch", objects.fetch_job(OWNER, spec, SETTINGS, "10Gi")),
        ("s3-trainer", multinode.indexed_job(OWNER, spec, SETTINGS)),
    ]


def test_the_fence_admits_the_environment_names_the_builders_write_and_no_other() -> None:
    assert _literal(JOBS, "envNames") == sorted(job.ENV_NAMES | multinode.ENV_NAMES)
    written: set[str] = set()
    for kind, built in [*_jobs(), *_s3_jobs()]:
        names = {e["name"] for e in _container(built)["env"]}
        assert names <= job.ENV_NAMES | multinode.ENV_NAMES, f"{kind}: {names - job.ENV_NAMES - multinode.ENV_NAMES}"
        written |= names
    # Every name in the list is one some Job really carries, bar the Hub variables no test sets.
    unused = (job.ENV_NAMES | multinode.ENV_NAMES) - written
    assert unused <= set(contract.HUB_ENDPOINT_ENV) - set(HUB_SETTINGS.hub_env), unused


def test_a_secret_reaches_the_pod_only_as_the_hub_token_from_its_key() -> None:
    tokens = [contract.HUB_TOKEN_ENV, contract.DATASET_HUB_TOKEN_ENV, contract.EVAL_HUB_TOKEN_ENV]
    assert _literal(JOBS, "hubTokenEnv") == tokens
    assert json.loads(_expression(JOBS, "hubTokenKey").replace("'", '"')) == contract.HUB_TOKEN_KEY
    assert _literal(JOBS, "hubEndpointEnv") == list(contract.HUB_ENDPOINT_ENV)
    refs = [
        (e["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for _, built in _jobs()
        for e in _container(built)["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    ]
    assert set(refs) == {(name, "token") for name in tokens}
    assert not any("envFrom" in _container(built) for _, built in _jobs())


def _expression(policy: dict[str, Any], name: str) -> str:
    (found,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == name]
    return str(found)


@pytest.mark.parametrize("hub", [True, False], ids=["hub", "claims"])
def test_hub_variables_are_the_settings_values_on_hub_jobs_only(hub: bool) -> None:
    spec = FineTuneJobSpec.model_validate(KINDS["hub-tokens"] if hub else KINDS["claims"])
    env = {e["name"]: e.get("value") for e in _container(job.job(OWNER, spec, HUB_SETTINGS))["env"]}
    endpoint = {k: v for k, v in env.items() if k in contract.HUB_ENDPOINT_ENV}
    assert endpoint == (dict(HUB_SETTINGS.hub_env) if hub else {})
    # The file's default: no value is admitted until the chart configures one.
    assert _literal(JOBS, "hubEnv") == {}


def test_the_fence_excludes_the_namespaces_the_operator_does() -> None:
    kinds = _source_policy("finetune-fence-kinds")
    assert _literal(kinds, "excludedNamespaces") == [*SYSTEM_NAMESPACES, SYSTEM_NAMESPACE]
    assert set(SYSTEM_NAMESPACES) <= set(Settings().excluded_namespaces)


def test_the_charts_schema_admits_the_hub_variables_the_fence_and_the_operator_know() -> None:
    schema = json.loads((FENCE_POLICY_FILE.parents[1] / "values.schema.json").read_text())
    hub_env = schema["properties"]["trainer"]["properties"]["hubEnv"]
    assert list(hub_env["properties"]) == list(contract.HUB_ENDPOINT_ENV)
    assert hub_env["additionalProperties"] is False


def _preflights() -> list[tuple[str, dict[str, Any]]]:
    from finetune_operator.builders import preflight

    out = []
    for kind, spec_body in KINDS.items():
        spec = FineTuneJobSpec.model_validate(spec_body)
        if preflight.needed(spec, SETTINGS):
            out.append((kind, preflight.preflight_job(OWNER, spec, SETTINGS)))
    return out


def test_the_fence_pins_the_preflight_shape_from_the_contract_and_the_builder() -> None:
    """The input check's command, folders, resources and name suffix, as the builder writes them."""
    assert _literal(JOBS, "preflightCommand") == list(contract.PREFLIGHT_COMMAND)
    assert json.loads(_expression(JOBS, "preflightSuffix").replace("'", '"')) == contract.PREFLIGHT_SUFFIX
    allowed = _literal(JOBS, "preflightMountPaths")
    assert set(allowed) < set(contract.MOUNT_PATHS) and contract.OUTPUT_MOUNT not in allowed
    built = _preflights()
    # The Hub kinds have nothing on a claim to check: they get no pre-flight.
    assert {kind for kind, _ in built} == {"claims", "kueue", "held-out"}
    for kind, preflight_job in built:
        container = _container(preflight_job)
        pod = preflight_job["spec"]["template"]["spec"]
        assert container["command"] == list(contract.PREFLIGHT_COMMAND), kind
        assert {m["mountPath"] for m in container["volumeMounts"]} <= set(allowed), kind
        for side in ("limits", "requests"):
            assert set(container["resources"][side]) <= set(_literal(JOBS, "preflightResources")), kind
        assert pod["automountServiceAccountToken"] is False and "nodeSelector" not in pod, kind
        assert preflight_job["metadata"]["name"].endswith(contract.PREFLIGHT_SUFFIX), kind


def test_s3_credentials_reach_a_pod_only_from_the_key_of_their_own_name() -> None:
    pairs = _literal(JOBS, "s3KeyEnv")
    prefixed = set(contract.DATASET_S3_KEY_ENV) | set(contract.EVAL_S3_KEY_ENV)
    assert set(pairs) == set(contract.S3_KEY_ENV) | prefixed == job.S3_ENV_NAMES
    prefixes = ("", contract.DATASET_S3_PREFIX, contract.EVAL_S3_PREFIX)
    assert pairs == {prefix + key: key for prefix in prefixes for key in contract.S3_KEY_ENV}
    assert _literal(JOBS, "fetchCommand") == list(contract.FETCH_COMMAND)
    assert json.loads(_expression(JOBS, "objectsMount").replace("'", '"')) == contract.OBJECTS_MOUNT
    assert json.loads(_expression(JOBS, "fetchSuffix").replace("'", '"')) == contract.FETCH_SUFFIX
    for kind, built in _s3_jobs():
        for entry in _container(built)["env"]:
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                assert pairs[entry["name"]] == ref["key"], (kind, entry)


def test_the_fence_names_a_jobs_own_policies_as_the_builder_does() -> None:
    """`<job>-network` and `<job>-rewards` (builders/network.py): the suffixes the fence admits."""
    from finetune_operator.builders import network

    policy = _source_policy("finetune-fence-networkpolicies")
    owner_rule = policy["spec"]["validations"][0]["expression"]
    assert f"variables.jobName + '{network.SUFFIX}'" in owner_rule
    assert f"variables.jobName + '{network.SERVICES_SUFFIX}'" in _expression(policy, "rewards")
    assert network.services_policy_name("x") == "x" + network.SERVICES_SUFFIX
    rules = [v.get("message", "") + v.get("messageExpression", "") for v in policy["spec"]["validations"]]
    assert any("rule networkpolicy-services:" in rule for rule in rules)

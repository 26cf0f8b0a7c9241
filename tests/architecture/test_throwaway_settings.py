"""An objective's settings block is part of its one module: the throwaway `halved` brings
`training.halved` (a bounded factor, and a rule of its entry's), `nested` a block of lists and
one-of rules as GRPO's rewards will be, each from a module of its own named in FINETUNE_PLUGINS,
with nothing else of the project changed (tests/support/throwaway_objectives.py).

In a fresh process, as the operator, the CLI and the trainer load plugins: importing the API loads
no plugin, and the first use finds them before the spec's schema is built, so the spec has the
fields (after `method`, in the registry's order) and `settings_of` reads them; the CRD carries the
blocks with their types, bounds and rules, and the API reference lists them; `ftjob validate`
refuses a block beside another method, an out-of-bound value, a misspelt field, the entry's rule,
a dataset format the method does not read and a reward of two kinds, one line each naming the
field; and the real API server, given the CRD that process made (under a group of its own),
refuses the same and keeps an unset block unset.
"""

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.fixtures.cluster import wait_for
from tests.support.api_cases import tiny_with
from tests.support.throwaway_objectives import (
    FLOOR,
    HALVED,
    NESTED,
    ONE_KIND,
    fresh_process,
    fresh_python,
    plugin_env,
)

REWARDS = [{"answer": {"pattern": "^42$"}}, {"length": {"target": 64}, "weight": 0.5}]
# (case, spec change, the offline line after `FILE: `, what the server's message holds)
REFUSED = [
    (
        "block beside sft",
        {"training": {"halved": {"factor": 0.5}}},
        "spec.training: training.halved is for training.method halved",
        "training.halved is for training.method halved",
    ),
    (
        "block beside dpo",
        {"training": {"method": "dpo", "halved": {}}, "dataset": {"format": "preference"}},
        "spec.training: training.halved is for training.method halved",
        "training.halved is for training.method halved",
    ),
    (
        "factor zero",
        {"training": {"method": "halved", "halved": {"factor": 0}}},
        "spec.training.halved.factor: Input should be greater than 0",
        "spec.training.halved.factor: Invalid value",
    ),
    (
        "factor above one",
        {"training": {"method": "halved", "halved": {"factor": 1.5}}},
        "spec.training.halved.factor: Input should be less than or equal to 1",
        "spec.training.halved.factor: Invalid value",
    ),
    (
        "misspelt field",
        {"training": {"method": "halved", "halved": {"fctor": 0.5}}},
        "spec.training.halved.fctor: unknown field (did you mean 'factor'?)",
        'unknown field "spec.training.halved.fctor"',
    ),
    (
        "entry's rule",
        {"training": {"method": "halved", "halved": {"factor": 0.01}, "learningRate": 1e-5}},
        f"spec.training: {FLOOR}",
        FLOOR,
    ),
    (
        "entry's rule on the defaults",
        {"training": {"method": "halved", "learningRate": 1e-6}},
        f"spec.training: {FLOOR}",
        FLOOR,
    ),
    (
        "a format the method does not read",
        {"training": {"method": "halved"}, "dataset": {"format": "text"}},
        "spec: dataset.format text is not one training.method halved reads (alpaca)",
        "dataset.format text is not one training.method halved reads (alpaca)",
    ),
    (
        "reward of two kinds",
        {"training": {"method": "nested", "nested": {"rewards": [{**REWARDS[0], **REWARDS[1]}]}}},
        f"spec.training.nested.rewards[0]: {ONE_KIND}",
        f'spec.training.nested.rewards[0]: Invalid value: "object": {ONE_KIND}',
    ),
    (
        "reward of no kind",
        {"training": {"method": "nested", "nested": {"rewards": [REWARDS[0], {"weight": 2}]}}},
        f"spec.training.nested.rewards[1]: {ONE_KIND}",
        f'spec.training.nested.rewards[1]: Invalid value: "object": {ONE_KIND}',
    ),
    (
        "too many rewards",
        {"training": {"method": "nested", "nested": {"rewards": REWARDS * 5}}},
        "spec.training.nested.rewards: List should have at most 8 items after validation, not 10",
        "spec.training.nested.rewards: Too many",
    ),
    (
        "bound inside a reward",
        {"training": {"method": "nested", "nested": {"rewards": [{"length": {"target": 0}}]}}},
        "spec.training.nested.rewards[0].length.target: Input should be greater than or equal to 1",
        "spec.training.nested.rewards[0].length.target: Invalid value",
    ),
]
# (case, training, the block as the server stores it: absent when unset, its defaults filled in)
ADMITTED = [
    ("halved unset", {"method": "halved"}, "halved", None),
    ("halved written", {"method": "halved", "halved": {"factor": 0.25}}, "halved", {"factor": 0.25}),
    ("halved empty", {"method": "halved", "halved": {}}, "halved", {"factor": 0.5}),
    (
        "nested",
        {"method": "nested", "nested": {"rewards": REWARDS}},
        "nested",
        {"rewards": [{**REWARDS[0], "weight": 1.0}, REWARDS[1]], "generations": 4},
    ),
]

MADE = """
import sys
from finetune_api import crd, reference
from finetune_api.resource import FineTuneJob
from finetune_api.spec import TrainingSpec

at_import = [name for name in PLUGINS if name in sys.modules]
job = FineTuneJob.model_validate(BODY)
from throwaway_objective import HalvedSpec
from nested_objective import NestedSpec

training = job.spec.training
print(json.dumps({
    "at_import": at_import,
    "fields": list(TrainingSpec.model_fields),
    "factor": training.settings_of(HalvedSpec).factor,
    "method settings": training.method_settings.model_dump(),
    "nested defaults": training.settings_of(NestedSpec).model_dump(),
    "crd": crd.crd(),
    "reference": reference.render(),
}))
"""


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What a fresh process with both plugins makes: its spec's fields, a job's blocks, the CRD."""
    env = plugin_env(tmp_path_factory.mktemp("plugins"), HALVED, NESTED)
    body = tiny_with({"training": {"method": "halved", "halved": {"factor": 0.25}}})
    made: dict[str, Any] = fresh_python(MADE, env, PLUGINS=[HALVED, NESTED], BODY=body)
    made["env"] = env
    return made


def _training(crd: dict[str, Any]) -> dict[str, Any]:
    training: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["training"]
    return training


def test_the_first_use_finds_the_plugins_and_the_spec_has_their_blocks(made: dict[str, Any]) -> None:
    assert made["at_import"] == []
    fields = made["fields"]
    assert fields[fields.index("method") :][:7] == ["method", "dpo", "orpo", "grpo", "halved", "nested", "parallelism"]
    assert made["factor"] == 0.25
    assert made["method settings"] == {"factor": 0.25}
    assert made["nested defaults"] == {
        "rewards": [{"answer": None, "length": {"target": 64}, "weight": 1.0}],
        "generations": 4,
    }


def test_the_crd_carries_each_block_with_its_type_bounds_and_rules(made: dict[str, Any]) -> None:
    training = _training(made["crd"])
    assert training["properties"]["method"]["enum"] == ["sft", "dpo", "orpo", "grpo", "halved", "nested"]
    assert training["properties"]["halved"] == {
        "type": "object",
        "description": "halved's settings (method halved; the defaults when unset).",
        "properties": {
            "factor": {
                "default": 0.5,
                "description": "What the loss is multiplied by.",
                "minimum": 0,
                "exclusiveMinimum": True,
                "maximum": 1,
                "type": "number",
            }
        },
    }
    rules = {rule["message"]: rule for rule in training["x-kubernetes-validations"]}
    assert rules["training.halved is for training.method halved"] == {
        "rule": "!has(self.halved) || self.method == 'halved'",
        "message": "training.halved is for training.method halved",
        "fieldPath": ".halved",
    }
    assert rules[FLOOR]["rule"].startswith("!has(self.method) || self.method != 'halved' || (")
    rewards = training["properties"]["nested"]["properties"]["rewards"]
    assert (rewards["type"], rewards["minItems"], rewards["maxItems"]) == ("array", 1, 8)
    reward = rewards["items"]
    assert [rule["message"] for rule in reward["x-kubernetes-validations"]] == [ONE_KIND]
    # Each kind is present only where written, or the one-of rule would refuse every reward.
    assert all("default" not in reward["properties"][kind] for kind in ("answer", "length"))
    assert "default" not in training["properties"]["halved"] and "default" not in training["properties"]["nested"]
    rows = made["reference"]
    assert "`halved`" in rows and "| `training.halved.factor` | number |" in rows
    assert "| `training.nested.rewards[].weight` |" in rows


def _manifests(folder: Path, cases: list[tuple[str, dict[str, Any]]]) -> dict[str, Path]:
    paths = {}
    for number, (case, change) in enumerate(cases):
        path = folder / f"job-{number}.yaml"
        path.write_text(yaml.safe_dump(tiny_with(change)), encoding="utf-8")
        paths[case] = path
    return paths


def test_ftjob_validate_refuses_each_in_one_line_naming_the_field(made: dict[str, Any], tmp_path: Path) -> None:
    valid = [(case, {"training": training}) for case, training, _, _ in ADMITTED]
    paths = _manifests(tmp_path, [(case, change) for case, change, _, _ in REFUSED] + valid)
    result = fresh_process(["-m", "finetune_cli", "validate", *map(str, paths.values())], made["env"])
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    for case, _, line, _ in REFUSED:
        assert [rest for rest in lines if rest.startswith(f"{paths[case]}: ")] == [f"{paths[case]}: {line}"], case
    for case, _ in valid:
        assert f"{paths[case]}: valid" in lines, case


@pytest.fixture(scope="module")
def throwaway_crd(made: dict[str, Any], kube: client.ApiClient) -> Iterator[str]:
    """The plugin process's CRD under a group of its own (the shared one stays as it is); its group."""
    apiext = client.ApiextensionsV1Api(kube)
    group = f"g{uuid.uuid4().hex[:8]}.throwaway.finetune.dev"
    body = json.loads(json.dumps(made["crd"]))
    body["spec"]["group"] = group
    body["metadata"]["name"] = f"{body['spec']['names']['plural']}.{group}"
    apiext.create_custom_resource_definition(body)
    try:

        def established() -> bool:
            crd = apiext.read_custom_resource_definition(body["metadata"]["name"])
            return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

        wait_for(established, 60, "the throwaway CRD to be established")
        yield group
    finally:
        apiext.delete_custom_resource_definition(body["metadata"]["name"])


def _create(custom: client.CustomObjectsApi, group: str, namespace: str, change: dict[str, Any]) -> dict[str, Any]:
    """Create the tiny job with `change` in the throwaway group (a new CRD's handler may 404 a moment)."""
    body = tiny_with(change)
    body["apiVersion"] = f"{group}/v1alpha1"
    body["metadata"]["name"] = f"j{uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + 30
    while True:
        try:
            created: dict[str, Any] = custom.create_namespaced_custom_object(
                group, "v1alpha1", namespace, "finetunejobs", body, field_validation="Strict"
            )
            return created
        except ApiException as err:
            if err.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.parametrize(("case", "training", "block", "stored"), ADMITTED, ids=[c[0] for c in ADMITTED])
def test_the_api_server_admits_a_block_and_keeps_an_unset_one_unset(
    throwaway_crd: str,
    custom: client.CustomObjectsApi,
    namespace: str,
    case: str,
    training: dict[str, Any],
    block: str,
    stored: dict[str, Any] | None,
) -> None:
    spec = _create(custom, throwaway_crd, namespace, {"training": training})["spec"]
    assert spec["training"].get(block) == stored
    others = {"dpo", "orpo", "grpo", "halved", "nested"} - {block}
    assert not others & spec["training"].keys()


@pytest.mark.parametrize(("case", "change", "line", "server"), REFUSED, ids=[c[0] for c in REFUSED])
def test_the_api_server_refuses_what_ftjob_validate_refuses(
    throwaway_crd: str,
    custom: client.CustomObjectsApi,
    namespace: str,
    case: str,
    change: dict[str, Any],
    line: str,
    server: str,
) -> None:
    with pytest.raises(ApiException) as refused:
        _create(custom, throwaway_crd, namespace, change)
    # 422 from the schema and the rules; 400 from the strict decoder (an unknown field).
    assert refused.value.status in (400, 422), refused.value.body
    message = json.loads(refused.value.body)["message"]
    assert server in message, message

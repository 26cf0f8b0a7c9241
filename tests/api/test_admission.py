"""The API server rejects what `ftjob validate` rejects: the same wrong specs, through admission.

The CRD's schema and CEL rules are generated from the same models as the offline check; this
proves the two agree on the real kube-apiserver, including immutability after creation.
"""

import copy
import json
import subprocess
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from finetune_api.constants import GROUP, PLURAL, VERSION
from finetune_api.generate import ROOT
from finetune_operator.decide import parse_spec
from tests.fixtures.cluster import Cluster
from tests.support.api_cases import GRPO_REWARD, TINY, WRONG_SPECS, grpo_with, tiny_with

pytestmark = pytest.mark.cluster

# Admission reports unknown fields from the strict decoder and bounds from the schema; the
# field path is what both sides must name.
ADMISSION_FIELD = {
    "unknown field": 'unknown field "spec.lora.rank"',
    "both model sources": "exactly one of pvc, hub or s3",
    "no model source": "exactly one of pvc, hub or s3",
    "bf16 on P40": "not supported on Pascal",
    "fp16 on P100": "not supported on Pascal",
    "epochs and maxSteps": "set either epochs or maxSteps",
    "no output": "spec.output: Required value",
    "deviceMap with processes": "spec.resources.processes",
    "deviceMap on two nodes": "spec.resources.nodes: Invalid value",
    "priority without a queue": "workloadPriorityClassName needs queueName",
    "s3 and pvc model": "exactly one of pvc, hub or s3",
}

# Fields the CRD leaves untyped (targetModules: a list, or one name as PEFT takes it;
# gradientCheckpointing, pairSplit: true, false or auto; activationOffload: inputs too): the
# server admits them, and the combinations of them that a rule would read, and the operator
# refuses a wrong one in one line before any child exists.
LEFT_TO_THE_OPERATOR = {
    "empty targetModules",
    "checkpointing sometimes",
    "offload yes",
    "offload sometimes",
    "inputs where no layer recomputes",
    "keptLayers with every layer recomputing",
    "pairSplit sometimes",
    "pairSplit with sft",
    # A pattern the trainer's regular expressions (Python's re) refuse: CEL has no such check.
    "grpo reward pattern not a regular expression",
}


def _kubectl(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cluster.layout.bin / "kubectl"), *args],
        env={"KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin:/bin"},
        check=False,
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="module")
def crd_installed(cluster: Cluster) -> None:
    """The committed CRD file, applied as the README says. Other test workers write the same CRD
    at their start (tests/support/install.py), and under load kubectl's wait once gave up (its
    default is 30 s) on 32 tests of one fresh-clone run: both steps are tried again for two
    minutes, and a failure says what kubectl said."""
    steps = (
        ("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds")),
        ("wait", "--for=condition=Established", "--timeout=60s", "crd/finetunejobs.finetune.dev"),
    )
    for step in steps:
        deadline = time.monotonic() + 120
        while (done := _kubectl(cluster, *step)).returncode != 0:
            assert time.monotonic() < deadline, f"kubectl {step[0]}: {done.stderr.strip() or done.stdout.strip()}"
            time.sleep(1)


def _create(custom: client.CustomObjectsApi, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict"
    )
    return result


@pytest.mark.parametrize(("case", "change", "expected"), WRONG_SPECS, ids=[c[0] for c in WRONG_SPECS])
def test_admission_rejects_each_wrong_spec(
    crd_installed: None,
    custom: client.CustomObjectsApi,
    namespace: str,
    case: str,
    change: dict[str, Any],
    expected: str,
) -> None:
    if case in LEFT_TO_THE_OPERATOR:
        _create(custom, namespace, tiny_with(change))
        spec, error = parse_spec(tiny_with(change))
        assert spec is None and error is not None and error.startswith(expected), error
        return
    with pytest.raises(ApiException) as failure:
        _create(custom, namespace, tiny_with(change))
    message = json.loads(failure.value.body)["message"]
    field = ADMISSION_FIELD.get(case, expected.split(":", maxsplit=1)[0])
    assert field in message, message


def test_defaults_are_applied_by_the_server(
    crd_installed: None, custom: client.CustomObjectsApi, namespace: str
) -> None:
    body = copy.deepcopy(TINY)
    del body["spec"]["lora"]
    created = _create(custom, namespace, body)
    spec = created["spec"]
    assert spec["lora"] == {
        "r": 8,
        "alpha": 16,
        "dropout": 0.05,
        "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    }
    assert spec["quantization"] == {"type": "nf4", "doubleQuant": True}
    assert spec["training"]["optimizer"] == "paged_adamw_8bit"
    assert spec["resources"]["nodes"] == 1
    assert spec["evaluation"] == {"base": True, "atCheckpoints": False, "generate": {"count": 4, "maxNewTokens": 64}}


def test_a_separate_eval_source_is_admitted_and_read_as_the_held_out_split(
    crd_installed: None, custom: client.CustomObjectsApi, namespace: str
) -> None:
    held_out = {"s3": {"bucket": "data", "key": "tiny/eval.jsonl"}}
    body = tiny_with({"dataset": {"evalFraction": None, "eval": held_out}})
    spec = _create(custom, namespace, body)["spec"]
    assert spec["dataset"]["eval"] == held_out
    parsed, error = parse_spec({"spec": spec})
    assert error is None and parsed is not None
    assert parsed.dataset.eval is not None and parsed.dataset.eval.s3 is not None
    assert parsed.dataset.held_out and parsed.dataset.eval_fraction is None


@pytest.mark.parametrize(
    ("training", "expected"),
    [
        ({"method": "dpo"}, None),
        ({"method": "dpo", "dpo": {}}, {"beta": 0.1, "lossType": "sigmoid"}),
        ({"method": "orpo", "orpo": {"beta": 0.5}}, {"beta": 0.5}),
    ],
    ids=["dpo unset", "dpo defaulted", "orpo"],
)
def test_a_preference_job_is_admitted_with_its_methods_block_only_when_written(
    crd_installed: None,
    custom: client.CustomObjectsApi,
    namespace: str,
    training: dict[str, Any],
    expected: dict[str, Any] | None,
) -> None:
    spec = _create(custom, namespace, tiny_with({"training": training, "dataset": {"format": "preference"}}))["spec"]
    block = training["method"]
    assert spec["training"].get(block) == expected
    other = {"dpo": "orpo", "orpo": "dpo"}[block]
    assert other not in spec["training"]
    # What the operator reads of it: the method's settings, its defaults where unset.
    parsed, error = parse_spec({"spec": spec})
    assert error is None and parsed is not None
    assert parsed.training.method == block


def test_a_grpo_job_is_admitted_with_its_rewards_defaulted(
    crd_installed: None, custom: client.CustomObjectsApi, namespace: str
) -> None:
    judge = {"name": "judge", "http": {"url": f"http://judge.{namespace}.svc.cluster.local:8080/score"}}
    spec = _create(custom, namespace, tiny_with(grpo_with({"rewards": [GRPO_REWARD, judge]})))["spec"]
    block = spec["training"]["grpo"]
    assert block["numGenerations"] == 8 and block["lossType"] == "dapo" and block["maxCompletionLength"] == 16
    assert block["rewards"][0] == {**GRPO_REWARD, "weight": 1.0}
    assert block["rewards"][1]["http"] == {**judge["http"], "timeoutSeconds": 30, "batchSize": 64}
    parsed, error = parse_spec({"spec": spec})
    assert error is None and parsed is not None and parsed.training.method == "grpo"


def test_the_server_words_a_method_and_format_refusal_as_ftjob_validate_does(
    crd_installed: None, custom: client.CustomObjectsApi, namespace: str
) -> None:
    for change, field in (
        ({"training": {"method": "orpo"}, "dataset": {"format": "messages"}}, "spec.dataset.format"),
        (
            {"training": {"method": "dpo", "packing": True}, "dataset": {"format": "preference"}},
            "spec.training.packing",
        ),
    ):
        body = tiny_with(change)
        _, offline = parse_spec(body)
        assert offline is not None
        with pytest.raises(ApiException) as failure:
            _create(custom, namespace, body)
        (cause,) = json.loads(failure.value.body)["details"]["causes"]
        assert cause["field"] == field
        # The offline line is `spec...: <message>`; the server's cause ends with the same message.
        assert cause["message"].endswith(offline.split(": ", 1)[1]), (cause, offline)


def test_spec_is_immutable_but_suspend_is_not(
    crd_installed: None, custom: client.CustomObjectsApi, namespace: str
) -> None:
    name = _create(custom, namespace, copy.deepcopy(TINY))["metadata"]["name"]
    with pytest.raises(ApiException) as failure:
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": {"lora": {"r": 16}}})
    assert "spec.lora" in (failure.value.body or "") and "immutable" in (failure.value.body or "")
    patched = custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"spec": {"suspend": True}}
    )
    assert patched["spec"]["suspend"] is True


@pytest.mark.parametrize("modules", ["all-linear", ["all-linear"], ["q_proj", "v_proj"]])
def test_target_modules_take_a_list_or_one_name_as_peft_does(
    crd_installed: None, custom: client.CustomObjectsApi, namespace: str, modules: Any
) -> None:
    created = _create(custom, namespace, tiny_with({"lora": {"targetModules": modules}}))
    assert created["spec"]["lora"]["targetModules"] == modules


@pytest.mark.parametrize("modules", ["", [], [""], [7], {"q_proj": True}, ["x" * 129], ["q_proj"] * 65])
def test_target_modules_of_another_shape_fail_in_the_operator_in_one_line(modules: Any) -> None:
    """The CRD leaves the node untyped (a list or one name); the operator's parse refuses the rest."""
    spec, error = parse_spec(tiny_with({"lora": {"targetModules": modules}}))
    assert spec is None and error is not None
    assert error.startswith("spec.lora.targetModules") and "\n" not in error, error


@pytest.mark.parametrize("value", [True, False, "auto"])
def test_checkpointing_and_offload_take_true_false_or_auto(
    crd_installed: None, custom: client.CustomObjectsApi, namespace: str, value: Any
) -> None:
    training = {"gradientCheckpointing": value, "activationOffload": value}
    created = _create(custom, namespace, tiny_with({"training": training}))
    assert {k: created["spec"]["training"][k] for k in training} == training


def test_offload_takes_inputs_and_the_layers_kept_and_pair_split_are_admitted(
    crd_installed: None, custom: client.CustomObjectsApi, namespace: str
) -> None:
    training = {"activationOffload": "inputs", "keptLayers": 3, "pairSplit": False}
    created = _create(custom, namespace, tiny_with({"training": training}))
    assert {k: created["spec"]["training"][k] for k in training} == training


def test_checkpointing_and_offload_default_to_auto(
    crd_installed: None, custom: client.CustomObjectsApi, namespace: str
) -> None:
    created = _create(custom, namespace, tiny_with({}))
    training = created["spec"]["training"]
    assert (training["gradientCheckpointing"], training["activationOffload"]) == ("auto", "auto")
    assert training["pairSplit"] == "auto" and "keptLayers" not in training

"""The committed CRD is exactly what the models generate, and the schema is structural."""

from pathlib import Path
from typing import Any

import yaml

from finetune_api import crd
from finetune_api.generate import TARGETS, stale_targets
from finetune_api.spec import DEVICE_MAP_ONE_NODE


def test_committed_crds_match_the_models() -> None:
    stale = stale_targets(crd.render_yaml())
    assert not stale, f"run `make crds`: {[str(p) for p in stale]}"


def test_chart_copy_is_identical() -> None:
    assert len({Path(t).read_text() for t in TARGETS}) == 1


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        out.append((path, node))
        for key, value in node.get("properties", {}).items():
            out.extend(_walk(value, f"{path}.{key}"))
        if isinstance(node.get("items"), dict):
            out.extend(_walk(node["items"], f"{path}[]"))
        if isinstance(node.get("additionalProperties"), dict):
            out.extend(_walk(node["additionalProperties"], f"{path}{{}}"))
    return out


def test_schema_is_structural_and_bounded() -> None:
    schema = crd.openapi_schema()
    for path, node in _walk(schema["properties"]["spec"], "spec"):
        assert "$ref" not in node and "title" not in node, path
        assert node.get("additionalProperties") is not False, path
        if not node.get("x-kubernetes-int-or-string") and not node.get("x-kubernetes-preserve-unknown-fields"):
            assert "type" in node, f"{path} has no type"
            assert "anyOf" not in node, path
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node, f"{path} is an unbounded string"
        if node.get("type") == "array":
            assert "maxItems" in node, f"{path} is an unbounded list"


def test_an_object_the_models_default_to_none_stays_absent_and_carries_no_mark() -> None:
    """`training.dpo` (default None) gets no `{}` default, or the server would write it into every
    job and its own rule refuse them all; `training` (a default object) gets one; the mark that
    tells them apart never leaves the generator."""
    spec = crd.spec_schema()
    training = spec["properties"]["training"]
    assert training["default"] == {}
    for block in ("dpo", "orpo"):
        assert "default" not in training["properties"][block]
        assert training["properties"][block]["properties"]["beta"]["default"] == 0.1  # its own defaults stay
    assert crd.ABSENT not in str(crd.crd()) and crd.ABSENT not in str(crd.structural_schema(crd.FineTuneJobSpec))


def test_defaults_enums_and_rules_are_carried() -> None:
    spec = crd.spec_schema()
    lora = spec["properties"]["lora"]
    assert lora["default"] == {}
    assert lora["properties"]["r"] == {
        "default": 8,
        "description": "LoRA rank.",
        "maximum": 256,
        "minimum": 1,
        "type": "integer",
    } | {k: v for k, v in lora["properties"]["r"].items() if k == "x-kubernetes-validations"}
    # A list or one name: untyped in the CRD (no structural list-or-string), checked by the operator.
    assert lora["properties"]["targetModules"]["x-kubernetes-preserve-unknown-fields"] is True
    assert lora["properties"]["targetModules"]["default"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert spec["properties"]["quantization"]["properties"]["type"]["enum"] == ["nf4", "fp4", "none"]
    assert spec["properties"]["training"]["properties"]["learningRate"]["exclusiveMinimum"] is True
    rules = [r["rule"] for r in spec["properties"]["model"]["properties"]["source"]["x-kubernetes-validations"]]
    assert "(has(self.pvc) ? 1 : 0) + (has(self.hub) ? 1 : 0) + (has(self.s3) ? 1 : 0) == 1" in rules
    assert any("Tesla-P" in r["rule"] for r in spec["x-kubernetes-validations"])
    assert {"rule": "self == oldSelf", "message": crd.IMMUTABLE_MESSAGE} in spec["properties"]["lora"][
        "x-kubernetes-validations"
    ]
    assert "x-kubernetes-validations" not in spec["properties"]["suspend"]
    nodes = spec["properties"]["resources"]["properties"]["nodes"]
    assert (nodes["default"], nodes["minimum"], nodes["maximum"]) == (1, 1, 64)
    node_rules = [r for r in spec["x-kubernetes-validations"] if r.get("fieldPath") == ".resources.nodes"]
    assert [r["message"] for r in node_rules] == [DEVICE_MAP_ONE_NODE]


def test_crd_names_and_columns() -> None:
    body = yaml.safe_load(crd.render_yaml())
    names = body["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("FineTuneJob", "finetunejobs", ["ftj"])
    version = body["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase",
        "Progress",
        "Step",
        "Loss",
        "EvalLoss",
        "Metrics",
        "Evaluation",
        "GPUs",
        "Nodes",
        "Ready",
        "Queue",
        "Admission",
        "Preemptions",
        "Age",
        "Message",
    ]
    # Strings the trainer writes ready to read (8.3%, 1.235): a printer column cannot format.
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert (columns["Progress"]["type"], columns["Progress"]["jsonPath"]) == ("string", ".status.progress.percentText")
    assert (columns["Loss"]["type"], columns["Loss"]["jsonPath"]) == ("string", ".status.progress.lossText")
    # The held-out loss only with -o wide: most jobs' plain listing stays narrow.
    eval_column = columns["EvalLoss"]
    assert (eval_column["type"], eval_column["jsonPath"], eval_column["priority"]) == (
        "string",
        ".status.progress.evalLossText",
        1,
    )
    # The base against the tuned model, one short line the trainer writes, also only with -o wide.
    evaluation = columns["Evaluation"]
    assert (evaluation["type"], evaluation["jsonPath"], evaluation["priority"]) == (
        "string",
        ".status.evaluation.summary",
        1,
    )
    # The training method's figures (dpo, orpo) in short, also only with -o wide.
    metrics_column = columns["Metrics"]
    assert (metrics_column["type"], metrics_column["jsonPath"], metrics_column["priority"]) == (
        "string",
        ".status.progress.metricsText",
        1,
    )
    progress = body["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"evalLoss", "evalLossText", "evalStep"} <= set(progress["progress"]["properties"])
    kept = progress["progress"]["properties"]
    assert {"pairs", "metrics", "metricsText"} <= set(kept)
    assert kept["metrics"]["additionalProperties"] == {"type": "number"} and kept["metrics"]["maxProperties"] == 16

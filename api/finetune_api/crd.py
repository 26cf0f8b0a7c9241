"""Generate the CustomResourceDefinition from the pydantic models.

pydantic emits JSON Schema 2020-12; the API server wants a *structural* OpenAPI v3 schema:
no `$ref`, no nullable unions, boolean exclusive bounds, no `additionalProperties: false`,
no `propertyNames`. This module does that translation and adds what only Kubernetes has:
CEL transition rules for immutability, printer columns, the status subresource.
"""

import copy
from typing import Any, Final

from pydantic import BaseModel

from .constants import (
    CATEGORIES,
    CRD_NAME,
    GROUP,
    KIND,
    MAX_NAME_LENGTH,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
)
from .spec import MUTABLE_AFTER_START, FineTuneJobSpec
from .status import FineTuneJobStatus

Schema = dict[str, Any]

IMMUTABLE_MESSAGE = (
    "is immutable once the job exists (only suspend, activeDeadlineSeconds and "
    "ttlSecondsAfterFinished may change); delete and recreate the FineTuneJob to change it"
)

PRINTER_COLUMNS: list[Schema] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "Progress",
        "type": "string",
        "jsonPath": ".status.progress.percentText",
        "description": "Percent of steps done.",
    },
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Loss", "type": "string", "jsonPath": ".status.progress.lossText"},
    {
        "name": "EvalLoss",
        "type": "string",
        "jsonPath": ".status.progress.evalLossText",
        "priority": 1,
        "description": "Loss on the held-out split at the last evaluation (every checkpoint, and the end).",
    },
    {
        "name": "Metrics",
        "type": "string",
        "jsonPath": ".status.progress.metricsText",
        "priority": 1,
        "description": "The training method's own figures at the last report (dpo, orpo: reward accuracy and margin).",
    },
    {
        "name": "Evaluation",
        "type": "string",
        "jsonPath": ".status.evaluation.summary",
        "priority": 1,
        "description": "The base against the tuned model on the held-out split, e.g. loss 2.31 -> 1.05.",
    },
    {"name": "GPUs", "type": "integer", "jsonPath": ".spec.resources.gpus"},
    {
        "name": "Nodes",
        "type": "integer",
        "jsonPath": ".spec.resources.nodes",
        "priority": 1,
        "description": "Pods of one attempt; the world size is nodes x GPUs.",
    },
    {
        "name": "Ready",
        "type": "integer",
        "jsonPath": ".status.nodes.ready",
        "priority": 1,
        "description": "Pods of a job of several nodes whose trainer runs.",
    },
    {
        "name": "Queue",
        "type": "string",
        "jsonPath": ".spec.placement.queueName",
        "priority": 1,
        "description": "Kueue LocalQueue.",
    },
    {
        "name": "Admission",
        "type": "string",
        "jsonPath": ".status.queue.reason",
        "priority": 1,
        "description": "Kueue's reason for where the job's Workload stands.",
    },
    {"name": "Preemptions", "type": "integer", "jsonPath": ".status.queue.preemptions", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Message",
        "type": "string",
        "jsonPath": ".status.message",
        "description": "Why the job waits or failed: Kueue's words while queued (e.g. insufficient quota).",
    },
]


# The mark `_resolve` leaves on an object whose field the models default to None: absent unless
# the user writes it. Internal to this module: no schema leaves it with the mark.
ABSENT: Final = "x-finetune-absent-unless-written"


def _resolve(node: Any, defs: Schema) -> Any:
    """Inline `$ref`s and flatten `X | None` unions, recursively."""
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    ref = node.pop("$ref", None)
    if ref is not None:
        target = copy.deepcopy(defs[ref.rsplit("/", 1)[-1]])
        merged = {**target, **node}
        if "x-kubernetes-validations" in target and "x-kubernetes-validations" in node:
            merged["x-kubernetes-validations"] = target["x-kubernetes-validations"] + node["x-kubernetes-validations"]
        node = merged
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        del node["anyOf"]
        absent = node.get("default", 0) is None
        if absent:
            del node["default"]
        if len(options) == 1:
            inner = _resolve(options[0], defs)
            node = {**inner, **{k: v for k, v in node.items() if k in ("description", "default")}}
            if "x-kubernetes-validations" in inner:
                node["x-kubernetes-validations"] = inner["x-kubernetes-validations"]
            if absent and node.get("type") == "object":
                node[ABSENT] = True
        else:
            node["anyOf"] = options
    return {k: _resolve(v, defs) for k, v in node.items()}


def _unmarked(node: Any) -> Any:
    """The schema without this module's ABSENT marks."""
    if isinstance(node, list):
        return [_unmarked(n) for n in node]
    if not isinstance(node, dict):
        return node
    return {k: _unmarked(v) for k, v in node.items() if k != ABSENT}


def _clean(node: Any) -> Any:
    """Drop JSON-Schema-only keywords and convert bounds to OpenAPI v3."""
    if isinstance(node, list):
        return [_clean(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: Schema = {}
    if "patternProperties" in node:
        # Map keys with a pattern: the API server has no patternProperties, so the values'
        # schema becomes additionalProperties and the key pattern is checked by the models only.
        node = {k: v for k, v in node.items() if k != "patternProperties"} | {
            "additionalProperties": next(iter(node["patternProperties"].values()))
        }
    for key, value in node.items():
        if key in ("title", "$defs", "propertyNames", "discriminator"):
            continue
        if key == "additionalProperties" and value is False:
            continue
        if key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"], out["exclusiveMinimum"] = value, True
            continue
        if key == "exclusiveMaximum" and not isinstance(value, bool):
            out["maximum"], out["exclusiveMaximum"] = value, True
            continue
        if key == "const":
            out["enum"] = [value]
            continue
        if key == "default" and value is None:
            continue
        out[key] = _clean(value)
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
    return out


def structural_schema(model: type[BaseModel], *, marked: bool = False) -> Schema:
    """The model's OpenAPI v3 schema; `marked` keeps the ABSENT marks for `_default_empty_objects`."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    result: Schema = _clean(_resolve(raw, defs))
    return result if marked else _unmarked(result)


def _default_empty_objects(node: Schema) -> None:
    """Give optional sub-objects without required fields `default: {}`.

    The API server applies defaults only inside objects that exist; `lora: {}` as a default
    makes `r: 8` and friends appear even when the user wrote no `lora:` at all. An object the
    models default to None (ABSENT: `training.dpo`) is left without one: there its presence is
    what the user said, and a rule may read it (`!has(self.dpo) || self.method == 'dpo'`).
    """
    required = set(node.get("required", []))
    for name, prop in node.get("properties", {}).items():
        if prop.get("type") == "object" and "properties" in prop:
            _default_empty_objects(prop)
            absent = prop.get(ABSENT, False)
            if name not in required and not prop.get("required") and "default" not in prop and not absent:
                prop["default"] = {}


def _immutability(spec: Schema) -> None:
    optional_rules = []
    required = set(spec.get("required", []))
    for name, prop in spec["properties"].items():
        if name in MUTABLE_AFTER_START:
            continue
        prop.setdefault("x-kubernetes-validations", []).append(
            {"rule": "self == oldSelf", "message": IMMUTABLE_MESSAGE}
        )
        if name not in required and "default" not in prop:
            optional_rules.append(
                {
                    "rule": f"has(self.{name}) == has(oldSelf.{name})",
                    "message": f"{name} {IMMUTABLE_MESSAGE}",
                    "fieldPath": f".{name}",
                }
            )
    spec.setdefault("x-kubernetes-validations", []).extend(optional_rules)


def defaulted_schema(model: type[BaseModel]) -> Schema:
    """A spec's schema with `default: {}` on the optional objects the API server should fill in."""
    marked = structural_schema(model, marked=True)
    _default_empty_objects(marked)
    schema: Schema = _unmarked(marked)
    return schema


def spec_schema() -> Schema:
    schema = defaulted_schema(FineTuneJobSpec)
    _immutability(schema)
    return schema


def status_schema() -> Schema:
    return structural_schema(FineTuneJobStatus)


def openapi_schema() -> Schema:
    return {
        "type": "object",
        "description": "A QLoRA fine-tuning run: model, data, adapter shape and the GPUs to train on.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": status_schema(),
        },
        "x-kubernetes-validations": [
            {
                "rule": f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
                "message": f"metadata.name must be at most {MAX_NAME_LENGTH} characters "
                "(it names the Job, its pods and their labels)",
            }
        ],
    }


def definition(
    *,
    crd_name: str,
    kind: str,
    plural: str,
    singular: str,
    short_names: tuple[str, ...],
    columns: list[Schema],
    schema: Schema,
) -> Schema:
    """A CustomResourceDefinition of one namespaced kind of the group, with the status subresource."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": crd_name,
            "labels": {"app.kubernetes.io/name": "finetune-operator", "app.kubernetes.io/part-of": "finetune-operator"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def crd() -> Schema:
    return definition(
        crd_name=CRD_NAME,
        kind=KIND,
        plural=PLURAL,
        singular=SINGULAR,
        short_names=SHORT_NAMES,
        columns=PRINTER_COLUMNS,
        schema=openapi_schema(),
    )


def as_yaml(definition: Schema) -> str:
    import yaml

    header = "# Generated from api/finetune_api by `make crds`. Do not edit by hand.\n"
    return header + yaml.safe_dump(definition, sort_keys=False, width=120)


def render_yaml() -> str:
    return as_yaml(crd())

"""The ModelServer example, varied, and the wrong servers both `ftjob validate` and the API server
refuse (the per-object rules; what needs other objects is finetune_api.served_files')."""

import copy
from pathlib import Path
from typing import Any

import yaml

from finetune_operator.builders.serving import output_status
from tests.support.specs import spec

ROOT = Path(__file__).resolve().parents[2]

SERVER = yaml.safe_load((ROOT / "examples" / "serve-support-chat.yaml").read_text())
GGUF = {"claimName": "models", "path": "gguf/adapter.gguf"}


def server_with(change: dict[str, Any], meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The example with `change` set in its spec (None deletes a key) and `meta` in its metadata."""
    body = copy.deepcopy(SERVER)
    for key, value in change.items():
        if value is None:
            body["spec"].pop(key, None)
        else:
            body["spec"][key] = value
    body["metadata"].update(meta or {})
    return body


# (case, spec change, metadata change, the line `ftjob validate` prints, what admission names)
WRONG_SERVERS: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
    (
        "base of both kinds",
        {"base": {"job": "a", "pvc": GGUF}},
        {},
        "spec.base: exactly one of job or pvc must be set",
        "exactly one of job or pvc must be set",
    ),
    ("no base", {"base": {}}, {}, "spec.base: exactly one of job or pvc must be set", "exactly one of job or pvc"),
    (
        "adapter not gguf",
        {"adapters": [{"pvc": {"claimName": "models", "path": "adapter/adapter_model.safetensors"}}]},
        {},
        "spec.adapters[0].pvc: path must name a .gguf file, without a comma or a colon",
        "spec.adapters[0].pvc.path: Invalid value",
    ),
    (
        "adapter path with a comma",
        {"adapters": [{"pvc": {"claimName": "models", "path": "a,b.gguf"}}]},
        {},
        "spec.adapters[0].pvc: path must name a .gguf file, without a comma or a colon",
        "spec.adapters[0].pvc.path: Invalid value",
    ),
    (
        "adapter twice",
        {"adapters": [{"job": "a"}, {"pvc": GGUF}, {"job": "a"}]},
        {},
        "spec: adapters lists an adapter twice (the same job, or the same claim and path)",
        "spec.adapters: Invalid value",
    ),
    (
        "slots too small",
        {"contextSize": 1024, "parallel": 16},
        {},
        "spec: contextSize / parallel (each slot's context) must be at least 128 tokens",
        "spec.contextSize: Invalid value",
    ),
    ("too many adapters", {"adapters": [{"job": f"j{i}"} for i in range(17)]}, {}, "spec.adapters:", "spec.adapters"),
    ("nine gpus", {"resources": {"gpus": 9}}, {}, "spec.resources.gpus:", "spec.resources.gpus"),
    (
        "unknown field",
        {"contextLength": 4096},
        {},
        "spec.contextLength: unknown field (did you mean 'contextSize'?)",
        'unknown field "spec.contextLength"',
    ),
    (
        "name not a service name",
        {},
        {"name": "7b-support"},
        "metadata.name: String should match pattern",
        "metadata.name must start with a letter",
    ),
]


def job(name: str, *, phase: str = "Succeeded", fingerprint: str | None = "aaaa", formats: list[str] | None = None,
        exported: str | None = None) -> dict[str, Any]:  # fmt: skip
    """A FineTuneJob as the API server returns it to a ModelServer's check: spec, and status as the
    operator (status.output, from its builders) and the trainer (modelFingerprint) wrote it."""
    asked = ["gguf-lora"] if formats is None else formats
    built = spec(output={"pvc": {"claimName": "outputs", "path": f"runs/{name}"}, "formats": asked})
    status: dict[str, Any] = {"phase": phase, "output": output_status(name, built, "outputs")}
    if fingerprint:
        status["modelFingerprint"] = fingerprint
    if exported:
        status["conditions"] = [{"type": "Exported", "status": "False", "reason": "ExportFailed", "message": exported}]
    return {"spec": {"output": {"formats": asked}}, "status": status}

"""FineTuneJob specs the operator tests share: small, valid, easy to vary."""

import copy
from typing import Any

from finetune_api.spec import FineTuneJobSpec
from finetune_operator.children import Owner

OWNER = Owner(name="tiny", namespace="team-a", uid="0000-uid")

BASE: dict[str, Any] = {
    "model": {"source": {"pvc": {"claimName": "models", "path": "tiny-llama"}}},
    "dataset": {"source": {"pvc": {"claimName": "datasets", "path": "tiny/alpaca.jsonl"}}, "format": "alpaca"},
    "output": {"pvc": {"claimName": "outputs"}},
    "precision": "fp32",
    "training": {"maxSteps": 6, "batchSize": 2, "gradientAccumulation": 1, "maxLength": 64},
    "checkpoints": {"everySteps": 2, "keep": 2},
    "resources": {"gpus": 0, "cpu": "1", "memory": "2Gi"},
}


def body(**overrides: Any) -> dict[str, Any]:
    """BASE with nested overrides: body(resources={"gpus": 4}) merges into resources."""
    out = copy.deepcopy(BASE)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def spec(**overrides: Any) -> FineTuneJobSpec:
    return FineTuneJobSpec.model_validate(body(**overrides))

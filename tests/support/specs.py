"""FineTuneJob specs the operator tests share: small, valid, easy to vary."""

import copy
from typing import Any

from finetune_api.spec import FineTuneJobSpec
from finetune_operator.children import Owner
from finetune_operator.settings import Settings
from hack.cluster.nodes import GPU_RESOURCE

OWNER = Owner(name="tiny", namespace="team-a", uid="0000-uid")
# Operator settings for the builders' tests: an image name no test pulls.
SETTINGS = Settings(trainer_image="registry.example/trainer:1", default_cpu="2", default_memory="8Gi")

BASE: dict[str, Any] = {
    "model": {"source": {"pvc": {"claimName": "models", "path": "tiny-llama"}}},
    "dataset": {"source": {"pvc": {"claimName": "datasets", "path": "tiny/alpaca.jsonl"}}, "format": "alpaca"},
    # Sample answers kept short: the trainer runs a few greedy forwards on the CPU, not hundreds.
    "output": {"pvc": {"claimName": "outputs"}, "samples": {"count": 1, "maxNewTokens": 8}},
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


def gpu_spec(gpus: int = 4, product: str = "Tesla-P40", **extra: object) -> dict:
    """A job KWOK runs: Hub sources (nothing to mount) and an output claim the operator makes."""
    return body(
        model={"source": {"hub": {"id": "org/tiny"}}},
        dataset={"source": {"hub": {"id": "org/data"}}, "format": "alpaca"},
        output={"pvc": None, "storage": {"size": "1Gi"}},
        resources={"gpus": gpus, "gpuProduct": product, "cpu": "2", "memory": "8Gi"},
        **extra,
    )


GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


def gpu_job(
    name: str, gpus: int, product: str = "Tesla-P40", annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations or {}},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"nvidia.com/gpu.product": product},
                    "tolerations": [GPU_TOLERATION],
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "trainer:test",
                            "command": ["python", "-m", "finetune_trainer"],
                            "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
                        }
                    ],
                },
            },
        },
    }

"""The ConfigMap holding the trainer's config: the validated spec plus in-pod paths, as JSON."""

from typing import Any

from finetune_api.spec import FineTuneJobSpec
from finetune_api.trainer_config import TrainerConfig

from ..children import Owner, config_map_name, metadata
from .paths import CONFIG_KEY, runtime_paths


def trainer_config(owner: Owner, spec: FineTuneJobSpec) -> TrainerConfig:
    return TrainerConfig(
        job_name=owner.name, namespace=owner.namespace, spec=spec, paths=runtime_paths(owner.name, spec)
    )


def config_map(owner: Owner, spec: FineTuneJobSpec) -> dict[str, Any]:
    # The spec names Secrets but never holds their values, so this JSON is safe to store.
    text = trainer_config(owner, spec).model_dump_json(by_alias=True, exclude_none=True, indent=2)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, config_map_name(owner.name)),
        "data": {CONFIG_KEY: text},
    }

"""The trainer's config: the validated spec plus in-pod paths, as JSON.

It travels in an annotation of the Job's pod template and reaches the trainer as a file through
a downwardAPI volume: no ConfigMap, so a job costs one write fewer and its config can never
drift from the pod that runs it.
"""

from finetune_api.spec import FineTuneJobSpec
from finetune_api.trainer_config import TrainerConfig

from ..children import Owner
from .paths import runtime_paths


def trainer_config(owner: Owner, spec: FineTuneJobSpec) -> TrainerConfig:
    return TrainerConfig(
        job_name=owner.name,
        namespace=owner.namespace,
        job_uid=owner.uid,
        spec=spec,
        paths=runtime_paths(owner.name, spec),
    )


def config_json(owner: Owner, spec: FineTuneJobSpec) -> str:
    # The spec names Secrets but never holds their values, so this JSON is safe in an annotation.
    return trainer_config(owner, spec).model_dump_json(by_alias=True, exclude_none=True, indent=2)

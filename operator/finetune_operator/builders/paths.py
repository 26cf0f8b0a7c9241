"""The trainer's paths inside the pod: each claim at its role's mount (finetune_api.contract)."""

from finetune_api import contract, layout
from finetune_api.spec import FineTuneJobSpec
from finetune_api.trainer_config import RuntimePaths

POD_MOUNTS = {
    "model": contract.MODEL_MOUNT,
    "dataset": contract.DATASET_MOUNT,
    "eval": contract.EVAL_MOUNT,
    "output": contract.OUTPUT_MOUNT,
    "objects": contract.OBJECTS_MOUNT,
}


def runtime_paths(job: str, spec: FineTuneJobSpec) -> RuntimePaths:
    return RuntimePaths.model_validate(
        contract.trainer_paths(job, spec, lambda role, _claim: POD_MOUNTS[role], contract.HUB_CACHE)
    )


def output_dir(job: str, spec: FineTuneJobSpec) -> str:
    return runtime_paths(job, spec).output


def adapter_path(job: str, spec: FineTuneJobSpec) -> str:
    return f"{output_dir(job, spec)}/{layout.ADAPTER_DIR}"


def merged_path(job: str, spec: FineTuneJobSpec) -> str | None:
    return f"{output_dir(job, spec)}/{layout.MERGED_DIR}" if "merged" in spec.output.written else None


def loss_curve_path(job: str, spec: FineTuneJobSpec) -> str:
    return f"{output_dir(job, spec)}/{layout.LOSS_CURVE_FILE}"


def tensorboard_path(job: str, spec: FineTuneJobSpec) -> str:
    return f"{output_dir(job, spec)}/{layout.TENSORBOARD_DIR}"

"""Where things are inside the trainer pod: the mount contract shared with the trainer."""

from typing import Final

from finetune_api.spec import FineTuneJobSpec
from finetune_api.trainer_config import RuntimePaths

CONFIG_DIR: Final = "/etc/finetune"
CONFIG_KEY: Final = "config.json"
CONFIG_PATH: Final = f"{CONFIG_DIR}/{CONFIG_KEY}"
# The pod template annotation that holds the config; a downwardAPI volume makes it CONFIG_PATH.
CONFIG_ANNOTATION: Final = "finetune.dev/trainer-config"
MODEL_MOUNT: Final = "/mnt/model"
DATASET_MOUNT: Final = "/mnt/dataset"
OUTPUT_MOUNT: Final = "/mnt/output"
SHM_MOUNT: Final = "/dev/shm"
TMP_MOUNT: Final = "/tmp"
# Hub downloads are cached on the output claim, so a retry does not download the model again.
HUB_CACHE: Final = f"{OUTPUT_MOUNT}/.hf-cache"
# What the trainer writes inside its output folder (status.output points here).
ADAPTER_DIR: Final = "adapter"
MERGED_DIR: Final = "merged"


def _join(mount: str, relative: str) -> str:
    return f"{mount}/{relative}" if relative else mount


def output_dir(job: str, spec: FineTuneJobSpec) -> str:
    relative = spec.output.pvc.path if spec.output.pvc is not None and spec.output.pvc.path else job
    return _join(OUTPUT_MOUNT, relative)


def runtime_paths(job: str, spec: FineTuneJobSpec) -> RuntimePaths:
    model = spec.model.source
    data = spec.dataset.source
    uses_hub = model.hub is not None or data.hub is not None
    return RuntimePaths(
        model=_join(MODEL_MOUNT, model.pvc.path) if model.pvc is not None else model.hub.id if model.hub else "",
        dataset=_join(DATASET_MOUNT, data.pvc.path) if data.pvc is not None else data.hub.id if data.hub else "",
        output=output_dir(job, spec),
        cache=HUB_CACHE if uses_hub else None,
    )


def adapter_path(job: str, spec: FineTuneJobSpec) -> str:
    return f"{output_dir(job, spec)}/{ADAPTER_DIR}"


def merged_path(job: str, spec: FineTuneJobSpec) -> str | None:
    return f"{output_dir(job, spec)}/{MERGED_DIR}" if spec.output.merge else None

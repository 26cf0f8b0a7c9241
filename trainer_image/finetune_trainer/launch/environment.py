"""Process environment the libraries read at import time, so it is set before torch loads.

`HF_HUB_OFFLINE=1` keeps a pod from hanging on the network when everything is on a volume;
the allocator setting fights fragmentation on long runs with varying sequence lengths.
"""

import os

from finetune_api import contract
from finetune_api.trainer_config import TrainerConfig


def uses_hub(config: TrainerConfig) -> bool:
    return contract.uses_hub(config.spec)


def prepare_process_environment(config: TrainerConfig) -> None:
    """Set library switches before the first import of torch / transformers / datasets."""
    if not uses_hub(config):
        os.environ.update(contract.OFFLINE)
    if config.paths.cache:
        os.environ.setdefault("HF_HOME", config.paths.cache)
    for key, value in contract.ALLOCATOR.items():
        os.environ.setdefault(key, value)
    # Tokenizers' thread pool and the data loader's fork do not mix; the loader runs in-process.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Never phone home for telemetry from a training pod.
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    if config.spec.resources.gpus == 0:
        # A CPU job must not grab a GPU that happens to be visible (the local `ftjob run` case).
        os.environ["CUDA_VISIBLE_DEVICES"] = ""

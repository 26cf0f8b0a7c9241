"""`--check-inputs`: the pre-flight Job's run, on the CPU, before the operator creates the GPU Job.

The same checks, in the same code, as the trainer's own first pass (recipe.Recipe._check_and_decide)
up to the point where hardware matters: the model folder and its config, the model's family, the
tokenizer, and the dataset through the check `ftjob check-data` runs. A bad path or a bad record
then costs a CPU pod of seconds, not a GPU pod after scheduling and an image pull. What is on
the Hub is not checked: the pre-flight pod has no network (and no token).
"""

import logging
from pathlib import Path
from typing import Any

from finetune_api.reasons import ExitReason
from finetune_api.trainer_config import TrainerConfig

from .failures import TrainerFailure

log = logging.getLogger(__name__)


def _model_folder(config: TrainerConfig) -> None:
    folder = Path(config.paths.model)
    if not folder.exists():
        raise TrainerFailure(ExitReason.InvalidConfig, f"spec.model.source.pvc: {folder}: no such folder")
    if not folder.is_dir():
        raise TrainerFailure(ExitReason.InvalidConfig, f"spec.model.source.pvc: {folder}: a file, not a model folder")


def _paths(config: TrainerConfig) -> None:
    """The paths alone, first: a wrong one is said in a second, before torch is imported."""
    if config.spec.model.source.pvc is not None:
        _model_folder(config)
    dataset = Path(config.paths.dataset)
    if config.spec.dataset.source.pvc is not None and not dataset.exists():
        # The words read_records uses, which the GPU pod would have said.
        raise TrainerFailure(ExitReason.InvalidData, f"spec.dataset: {dataset}: no such file or folder")


def check_inputs(config: TrainerConfig) -> dict[str, Any]:
    """What was checked, for the log; TrainerFailure (InvalidConfig, InvalidData) at the first problem."""
    spec = config.spec
    _paths(config)
    checked: dict[str, Any] = {}
    model_config: Any = None
    tokenizer: Any = None
    if spec.model.source.pvc is not None:
        from . import families
        from .model_loading import load_model_config, load_tokenizer

        model_config = load_model_config(config)  # no config.json there, or unreadable: InvalidConfig
        checked["family"] = families.check(model_config, spec).label
        tokenizer = load_tokenizer(config)
        checked["model"] = config.paths.model
    if spec.dataset.source.pvc is not None:
        from .data.loading import check_dataset

        # Without the tokenizer (a Hub model) the records are still checked, as `check-data` does.
        report = check_dataset(config, tokenizer, model_config)
        checked.update(dataset=config.paths.dataset, samples=len(report.samples), tokens=report.tokens)
    return checked

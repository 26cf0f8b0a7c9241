"""The one door from the CLI into the trainer: `finetune_trainer.seam`, loaded by name.

`ftjob run`, `ftjob check-data --tokenizer` and `ftjob make-tiny-model` run trainer code on
this machine; every other command needs neither torch nor the trainer. Loading by name keeps
the package graph one-way (nothing of the operator or CLI imports the trainer) and turns a
missing trainer extra into a one-line error.
"""

import importlib
from types import ModuleType

from .errors import CliError

SEAM = "finetune_trainer.seam"


def trainer(command: str) -> ModuleType:
    """The trainer's seam module; CliError naming `command` when the trainer is not installed."""
    try:
        return importlib.import_module(SEAM)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in {"finetune_trainer", "torch", "transformers", "peft"}:
            raise CliError(
                f"{command} runs the trainer here, which needs its extra: pip install 'finetune-operator[trainer]'"
                f" ({exc.name} is missing)"
            ) from None
        raise

"""The model family check shared by `ftjob validate --model-config`, `plan` and `check-data --tokenizer`.

Torch-free (`finetune_plan.families`): a model the trainer would refuse at start is refused here
in the same one line, before any GPU time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from finetune_api.spec import DEFAULT_TARGET_MODULES
from finetune_plan.families import ModelConfigError, check_model, describe

from .errors import CliError


def family_line(config: Mapping[str, Any], targets: Sequence[str] = DEFAULT_TARGET_MODULES, origin: str = "") -> str:
    """What the trainer will do with this model (family, kernel, logit transform, LoRA targets),
    or CliError (one line, exit 1) naming why it cannot train it."""
    try:
        family, modules = check_model(config, targets)
    except ModelConfigError as exc:
        raise CliError(f"{origin}: {exc}" if origin else str(exc)) from None
    return describe(family, modules)

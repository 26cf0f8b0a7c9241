"""The output formats' pre-flight checks (finetune_api.formats: each entry's `check`), run on the
CPU before any GPU time: by the pre-flight Job (input_check.py) and again by the trainer before
it loads a weight (a Hub model, or a cluster without the pre-flight). A format that cannot be
written fails the job there, in one line naming the format and the cause, not after training."""

from finetune_api.formats import FormatError, checks
from finetune_api.reasons import ExitReason
from finetune_api.registry import load
from finetune_api.trainer_config import TrainerConfig

from ..failures import TrainerFailure


def check_formats(config: TrainerConfig) -> list[str]:
    """The formats whose checks ran; TrainerFailure (InvalidConfig) at the first that fails."""
    ran = []
    for check, name in checks(config.spec.output.written).items():
        try:
            load(check)(config)
        except FormatError as exc:
            raise TrainerFailure(ExitReason.InvalidConfig, exc.said(name)) from None
        ran.append(name)
    return ran

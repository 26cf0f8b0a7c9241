"""The one exception the trainer raises for a failure it can name: reason + one-line message."""

from finetune_api.reasons import ExitReason


class TrainerFailure(Exception):
    """Ends the run with `reason`'s exit code and `Reason: message` in the termination log."""

    def __init__(self, reason: ExitReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

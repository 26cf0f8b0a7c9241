"""How the trainer tells the operator why it stopped: exit code + termination message.

The trainer exits with one of these codes and writes `Reason: message` to the termination
log; the operator's podFailurePolicy fails the Job at once on the non-retryable codes and
its status logic turns the reason into the Failed condition. Shared here so both sides
agree by construction.
"""

from enum import IntEnum
from typing import Final

TERMINATION_LOG: Final = "/dev/termination-log"


class ExitReason(IntEnum):
    # Retryable: the next attempt resumes from the last complete checkpoint.
    TrainerError = 1
    # Retryable and not counted against backoffLimit: stopped by SIGTERM (suspend, preemption,
    # drain) after writing a checkpoint of the exact point reached. Not 2, which argparse uses.
    Interrupted = 3
    # Retryable and counted: a launcher of a multi-node job did not meet all its peers at the
    # rendezvous within the bound (a pod unscheduled, crashed, or unreachable). Each attempt that
    # ends so counts against backoffLimit, so a gang that can never form fails instead of looping.
    RendezvousTimeout = 4
    # Retryable once and not counted: the GPU ran out of memory for the first time; the trainer
    # recorded a tighter plan with the same math (finetune_plan.tighter) on the output volume, and
    # the next attempt resumes with it from the last checkpoint. A second time is OutOfMemory.
    OutOfMemoryRetry = 5
    # Not retryable: the same input fails the same way on every attempt.
    InvalidConfig = 10
    InvalidData = 11
    NonFiniteLoss = 12
    WontFit = 13
    OutOfMemory = 14
    UnsupportedHardware = 15
    # A bf16/fp16 tensor in an fp32 run: a library cast something; Pascal would die on it.
    PrecisionViolation = 16
    # The output folder holds checkpoints this job must not resume: made by another model, LoRA,
    # data or schedule (spec.output.onExisting: resume), or any at all (onExisting: fail).
    CheckpointMismatch = 17


NON_RETRYABLE: Final = frozenset(
    {
        ExitReason.InvalidConfig,
        ExitReason.InvalidData,
        ExitReason.NonFiniteLoss,
        ExitReason.WontFit,
        ExitReason.OutOfMemory,
        ExitReason.UnsupportedHardware,
        ExitReason.PrecisionViolation,
        ExitReason.CheckpointMismatch,
    }
)


# Exits that are nobody's fault: the Job retries them without counting an attempt. The OOM retry
# happens once per job (its record on the output volume says so), so it cannot loop.
UNCOUNTED: Final = frozenset({ExitReason.Interrupted, ExitReason.OutOfMemoryRetry})


# Not an exit: the trainer exits 0 with its adapter written, and says in its termination message
# which formats it could not write (`ExportFailed: gguf: <cause>`); the operator sets the job's
# Exported condition False from it, and the job still ends Succeeded.
EXPORT_FAILED: Final = "ExportFailed"


def export_failed_message(failed: dict[str, str]) -> str:
    """`ExportFailed: gguf: <cause>; merged: <cause>`, one line within the kubelet's limit."""
    said = "; ".join(f"{name}: {' '.join(cause.split())}" for name, cause in failed.items())
    return f"{EXPORT_FAILED}: {said}"[:4000]


def export_failure(text: str | None) -> str | None:
    """What an ended trainer said it could not write (`<format>: <cause>`), or None."""
    head, sep, rest = (text or "").strip().partition(":")
    return rest.strip() if sep and head == EXPORT_FAILED else None


def termination_message(reason: ExitReason, message: str) -> str:
    """One line, `Reason: message`, short enough for the kubelet's 4 KiB limit."""
    flat = " ".join(message.split())
    return f"{reason.name}: {flat}"[:4000]


def parse_termination_message(text: str | None) -> tuple[str | None, str]:
    """(reason, message) from a termination message; reason None when it is not ours."""
    if not text:
        return None, ""
    head, sep, rest = text.strip().partition(":")
    if sep and head in ExitReason.__members__:
        return head, rest.strip()
    return None, text.strip()


def reason_for_exit_code(code: int) -> str | None:
    try:
        return ExitReason(code).name
    except ValueError:
        return None

"""Fault injection for the reliability tests, switched on only by FINETUNE_TEST_* variables.

The tests need to kill the trainer inside a checkpoint write, poison one loss and plant a
half-precision tensor at exact points; doing that from outside would be timing luck. Nothing
here acts unless its variable is set, and the operator never sets them.
"""

import os
import signal

KILL_IN_SAVE = "FINETUNE_TEST_KILL_IN_SAVE"  # step whose checkpoint write is cut short by SIGKILL
NONFINITE_AT = "FINETUNE_TEST_NONFINITE_AT"  # "STEP" or "STEP@RANK": optimizer step whose loss becomes NaN
KILL_RANK_AT = "FINETUNE_TEST_KILL_RANK_AT"  # "RANK@STEP": that rank SIGKILLs itself after that step
PLANT_HALF = "FINETUNE_TEST_PLANT_HALF"  # "parameter", "buffer" or "activation": plant a bf16 tensor
STEP_DELAY = "FINETUNE_TEST_STEP_DELAY"  # seconds to sleep per step, to widen kill windows


def _int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value and value.isdigit() else None


def die_in_save(step: int) -> None:
    """Called after the checkpoint's files are written, before they are marked complete."""
    if _int(KILL_IN_SAVE) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def nonfinite_at(step: int) -> bool:
    value = os.environ.get(NONFINITE_AT, "")
    at, _, rank = value.partition("@")
    return at.isdigit() and int(at) == step and (not rank or int(rank) == _rank())


def die_after_step(step: int) -> None:
    """SIGKILL this process after `step` when it is the rank KILL_RANK_AT names (one rank of N)."""
    rank, _, at = os.environ.get(KILL_RANK_AT, "").partition("@")
    if rank.isdigit() and at.isdigit() and int(rank) == _rank() and int(at) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def plant_half() -> str | None:
    return os.environ.get(PLANT_HALF) or None


def step_delay() -> float:
    try:
        return float(os.environ.get(STEP_DELAY, "0"))
    except ValueError:
        return 0.0

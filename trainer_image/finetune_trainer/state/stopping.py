"""SIGTERM as a request to stop at the next micro-batch boundary with nothing lost, and
checkpoints by the clock.

Kubernetes sends SIGTERM on suspend, Kueue preemption and node drain, then SIGKILL when the
pod's grace period ends. The handler only notes the request. The loop acts on it between
micro-batches, where the ranks agree (one tiny collective) to stop at the same point, and rank 0
writes a checkpoint of that point. A second SIGTERM changes nothing: the write under way
finishes, and the previous complete checkpoint stays until the new one is whole. Before training
begins there is nothing to save, so the request ends the run at once.
"""

from __future__ import annotations

import logging
import signal
import time
from types import FrameType

from finetune_api.reasons import ExitReason

from ..failures import TrainerFailure

log = logging.getLogger(__name__)


class StopRequest:
    """The process's SIGTERM, noted by the handler and acted on by the loop."""

    def __init__(self) -> None:
        self.at: float | None = None  # time.monotonic() of the first signal
        self.signals = 0
        self._armed = False

    def install(self) -> StopRequest:
        signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def arm(self) -> None:
        """Training has begun: from now on a signal waits for the next micro-batch boundary."""
        self._armed = True
        if self.at is not None:
            log.warning("SIGTERM came while loading; stopping at the first micro-batch boundary")

    @property
    def requested(self) -> bool:
        return self.at is not None

    def seconds_since(self) -> float:
        return time.monotonic() - self.at if self.at is not None else 0.0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        if self.at is not None:
            log.warning("SIGTERM again: the checkpoint under way finishes first")
            return
        self.at = time.monotonic()
        if not self._armed:
            raise TrainerFailure(
                ExitReason.Interrupted, "stopped by SIGTERM before training began; nothing to save, nothing lost"
            )
        log.warning("SIGTERM: stopping at the next micro-batch boundary with a checkpoint of that point")


class CheckpointClock:
    """`checkpoints.everyMinutes`: a checkpoint is due once this much training time has passed."""

    def __init__(self, every_minutes: float) -> None:
        self.every_s = every_minutes * 60.0
        self.since = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self.since >= self.every_s

    def reset(self) -> None:
        self.since = time.monotonic()


def interrupted(
    checkpoint: str, step: int, micro_done: int, accumulation: int, seconds: float | None
) -> TrainerFailure:
    """The exit of a stopped run: retryable, not counted, and it says where the next one starts."""
    where = f"{micro_done} of {accumulation} micro-batches of step {step + 1}" if micro_done else f"step {step}"
    took = f" {seconds:.1f} s after the signal" if seconds is not None else ""
    return TrainerFailure(
        ExitReason.Interrupted,
        f"stopped by SIGTERM after {where}; {checkpoint} written{took}; the job resumes from it",
    )

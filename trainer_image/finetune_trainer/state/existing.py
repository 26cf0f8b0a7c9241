"""What a start does with the checkpoints it finds: `spec.output.onExisting`, decided before any
weight loads, so a wrong resume fails at once and costs no attempt.

A job always resumes its own checkpoints (their `fingerprint.json` names its uid): suspends,
preemptions and retries go on as before. Checkpoints of another run (a job deleted and re-created
under the same name, a local run, or one written before fingerprints) are resumed when the
newest matches this job's fingerprint (`resume`, the default), moved aside with everything else
in the output folder (`fresh`), or refused (`fail`). A mismatch fails with CheckpointMismatch,
which the Job's pod failure policy does not retry, in one line naming each differing field and
the two ways out.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from finetune_api.reasons import ExitReason

from ..failures import TrainerFailure
from . import fingerprint
from .checkpoints import Checkpoint

log = logging.getLogger(__name__)

PREVIOUS_PREFIX = "previous-"
WAYS_OUT = (
    "to start over and keep the old folder, set spec.output.onExisting: fresh;"
    " or give the job another output folder (spec.output.pvc.path), or delete the old checkpoints"
)

Action = Literal["start", "resume", "moveAside"]


@dataclass(frozen=True)
class Found:
    """A complete checkpoint and its fingerprint record (None: written before fingerprints)."""

    checkpoint: Checkpoint
    record: dict[str, Any] | None

    def written_by(self, job_uid: str | None) -> bool:
        return job_uid is not None and self.record is not None and self.record.get("jobUid") == job_uid


def found(checkpoints: list[Checkpoint]) -> list[Found]:
    return [Found(c, fingerprint.read(c.path)) for c in checkpoints]


def decide(on_existing: str, existing: list[Found], current: dict[str, Any], job_uid: str | None) -> Action:
    """What to do with `existing` (oldest first); raises CheckpointMismatch where the job must not
    start. Pure: the caller moves folders and loads state."""
    if not existing:
        return "start"
    foreign = [f for f in existing if not f.written_by(job_uid)]
    newest = existing[-1]
    if foreign and on_existing == "fresh":
        return "moveAside"
    if foreign and on_existing == "fail":
        names = ", ".join(f.checkpoint.name for f in foreign)
        raise TrainerFailure(
            ExitReason.CheckpointMismatch,
            f"the output folder holds checkpoints of another run ({names}) and spec.output.onExisting is fail: "
            + WAYS_OUT.replace("to start over", "to start over anyway"),
        )
    if newest.record is None:
        log.warning(
            "%s carries no fingerprint (written before fingerprints): resumed unchecked", newest.checkpoint.name
        )
        return "resume"
    diff = fingerprint.differences(newest.record["fingerprint"], current)
    if diff:
        raise TrainerFailure(
            ExitReason.CheckpointMismatch,
            f"{newest.checkpoint.name} in the output folder was made by another run and cannot be resumed by this"
            f" job: {'; '.join(diff)}. {WAYS_OUT[0].upper()}{WAYS_OUT[1:]}",
        )
    return "resume"


def move_aside(output: Path, when: datetime.datetime | None = None) -> Path:
    """Everything in `output` but earlier `previous-*` folders, into `output/previous-<UTC time>/`
    (renames on one filesystem: nothing is copied, nothing lost)."""
    stamp = (when or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%dT%H%M%SZ")
    target = output / f"{PREVIOUS_PREFIX}{stamp}"
    number = 1
    while target.exists():
        number += 1
        target = output / f"{PREVIOUS_PREFIX}{stamp}-{number}"
    target.mkdir()
    for entry in sorted(output.iterdir()):
        if entry != target and not entry.name.startswith(PREVIOUS_PREFIX):
            entry.rename(target / entry.name)
    return target

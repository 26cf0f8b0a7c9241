"""The one place a test can inject a fault into the trainer: a set of hooks that do nothing.

The reliability tests need to kill the trainer inside a checkpoint write, poison one loss, run out
of GPU memory at a step or stop a rank after one; doing that from outside the process would be
timing luck. The trainer calls the hooks of `current()` at those points; here each is a no-op.
`install()` runs once as a trainer process starts (`launch.entry.main`, every rank of the
launcher too): where the variable `FAULTS_ENV` names a module, it imports it and takes that
module's `faults()`, a `Faults` whose hooks act. Only the test harness sets the variable (and the
path where its module lives); the operator never does, so a pod's trainer runs these no-ops. The
product reads no other variable for it, and no decision of a run is taken here: what a test
forces of the plan goes through the spec's own settings.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Final

FAULTS_ENV: Final = "FINETUNE_FAULTS"


class Faults:
    """The hooks, each a no-op; a test's module subclasses it and acts where its test asks."""

    def out_of_memory_at(self, step: int, *, tightened: bool) -> None:
        """As optimizer step `step` (1-based) begins; `tightened`: on the plan of an OOM's retry."""

    def nonfinite_at(self, step: int) -> bool:
        """Whether this micro-batch's loss of step `step` (1-based) becomes NaN."""
        return False

    def after_micro(self, step: int, micro: int) -> None:
        """After micro-batch `micro` (1-based) of step `step` (1-based)."""

    def after_step(self, step: int) -> None:
        """After optimizer step `step` (1-based) is counted and reported."""

    def before_evaluation(self, model: str, step: int) -> None:
        """As the evaluation of `model` ("base" or "tuned") at step `step` begins (evaluation/)."""

    def in_save(self, step: int) -> None:
        """After a checkpoint's files are written, before the checkpoint is marked complete."""

    def before_guard(self, model: object) -> None:
        """Before the fp32 guard scans the loaded model (an `nn.Module`) for half-precision tensors."""

    def before_export(self, name: str) -> None:
        """Before output format `name` is written (raising fails that format)."""

    def fetch_chunk(self, chunk: int) -> int:
        """Bytes per ranged GET of an S3 object's fetch (`chunk`: the trainer's own)."""
        return chunk

    def after_fetch_range(self) -> None:
        """After one ranged GET of an S3 object's fetch."""

    def reward_url(self, url: str) -> str:
        """Where an http reward's `url` is called: a test run without the cluster's DNS points a
        Service's name at its own local server here."""
        return url


_current: Faults = Faults()


def current() -> Faults:
    """The hooks in force: the no-ops unless `install` found a module."""
    return _current


def install(environ: Mapping[str, str] | None = None) -> Faults:
    """Take the hooks of the module `FAULTS_ENV` names (its `faults()`), if it names one."""
    global _current  # noqa: PLW0603 - the one process-wide seam, set once at start
    name = (os.environ if environ is None else environ).get(FAULTS_ENV, "").strip()
    if not name:
        _current = Faults()
        return _current
    made = importlib.import_module(name).faults()
    if not isinstance(made, Faults):
        raise TypeError(f"{FAULTS_ENV}={name}: faults() returned {type(made).__name__}, not a Faults")
    _current = made
    return _current

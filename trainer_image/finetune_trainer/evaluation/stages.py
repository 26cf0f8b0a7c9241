"""The evaluation's stages in a run, each collective (every rank calls it):

- `before`: the base (adapter off) once, after the resume and before the first step; skipped
  when `evaluation.base` is false or evaluation.json already holds an earlier attempt's base.
  It runs before the stop request is armed, so a SIGTERM during it ends the run at once: there
  is nothing to save.
- `at_checkpoint`: the tuned model after a checkpoint is written (`evaluation.atCheckpoints`),
  into the history.
- `after`: the tuned model once the last checkpoint is written, then both models' greedy
  answers (`evaluation.generate`). A SIGTERM during either is agreed on between micro-batches
  (or answers), and the stage says it stopped: the checkpoint already holds every step, so the
  next attempt resumes at the final step and only evaluates.

Rank 0 reports each measure: the `evaluation` event, TensorBoard, status.evaluation, and
evaluation.json (files.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_api.spec import EvaluationSpec

from .. import faults
from ..distributed.gradsync import sum_figures
from ..reporting.progress import Progress
from . import files
from .generation import Answering, Generated, chosen, generate
from .measure import Measured, measure
from .passes import HeldOutPass

log = logging.getLogger(__name__)


@dataclass
class Evaluation:
    """The run's evaluation: what it measures on (`held_out`, the rows whose index is the held-out
    example's, the samples), what answers, what the spec asks, and what rank 0 reports to."""

    held_out: HeldOutPass
    rows: Sequence[Any]
    samples: Sequence[dict[str, Any]]
    answering: Answering
    asked: EvaluationSpec
    record: files.Record
    stop: Callable[[], bool]
    base_known: bool = False  # an earlier attempt measured the base (rank 0 read it back)
    path: Path | None = None  # evaluation.json, on rank 0
    progress: Progress | None = None  # rank 0's

    def before(self, step: int) -> None:
        """The base's figures, once per run."""
        if not self.asked.base:
            return
        if self.base_known:
            log.info("evaluation: the base's figures are those of an earlier attempt (%s)", self.path)
            return
        faults.current().before_evaluation("base", step)
        measured = measure(self.held_out, self.rows, base=True)
        assert measured is not None  # no stop is agreed on before training
        self.record.base = dict(measured.figures)
        self.record.base_examples = measured.per_example
        self.record.seconds["base"] = measured.seconds
        self._report("base", step, measured.figures, measured.seconds)

    def at_checkpoint(self, step: int) -> bool:
        """The tuned model's figures at a checkpoint; False when a stop came first."""
        faults.current().before_evaluation("tuned", step)
        measured = measure(self.held_out, self.rows, base=False, stop=self.stop)
        if measured is None:
            return False
        self._tuned(step, measured)
        self._report("tuned", step, measured.figures, measured.seconds)
        return True

    def after(self, step: int) -> bool:
        """The tuned model's figures after training, then both models' answers; False when a stop
        came first."""
        faults.current().before_evaluation("tuned", step)
        measured = measure(self.held_out, self.rows, base=False, stop=self.stop)
        if measured is None:
            return False
        self._tuned(step, measured)
        self.record.seconds["tuned"] = measured.seconds
        generated = self._generate()
        stopped = generated is None or self.stop()
        if sum_figures([1.0 if stopped else 0.0], self.held_out.ranks.world_size, self.held_out.device)[0] > 0:
            return False
        assert generated is not None
        if generated.answers:
            self.record.answers = generated.answers
            self.record.base.update(generated.base)
            self.record.tuned.update(generated.tuned)
            self.record.seconds["generation"] = generated.seconds
            if self.progress is not None and generated.base:
                self.progress.evaluation("base", step, dict(generated.base), generated.seconds)
        self._report("tuned", step, self.record.tuned, measured.seconds)
        return True

    def _tuned(self, step: int, measured: Measured) -> None:
        self.record.step = step
        self.record.tuned = dict(measured.figures)
        self.record.tuned_examples = measured.per_example
        if self.asked.at_checkpoints:
            self.record.add_history(step, measured.figures)

    def _generate(self) -> Generated | None:
        asked = self.asked.generate
        examples = chosen(self.samples, asked.count, self.answering.tokenizer) if asked.count else []
        if not examples:
            return Generated()
        return generate(self.answering, examples, asked.max_new_tokens, self.stop)

    def _report(self, model: str, step: int, figures: files.Figures, seconds: float) -> None:
        """Rank 0: the event and TensorBoard, evaluation.json and status.evaluation."""
        if self.progress is None or self.path is None:
            return
        self.progress.evaluation(model, step, figures, seconds)
        files.write(self.path, self.record)
        if self.progress.reporter is not None:
            self.progress.reporter.evaluation(files.status_of(self.record))

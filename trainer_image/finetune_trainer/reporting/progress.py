"""Progress as it happens: a JSON line per logging step on stdout, loss spikes, status patches.

One line per event keeps the log machine-readable (`kubectl logs | jq`) and is what the tests
read to compare loss curves across a kill and a resume.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .status_patch import StatusReporter


class _Scalars(Protocol):
    """What the progress writes to TensorBoard through (torch's SummaryWriter, whose methods
    torch 2.7 leaves unannotated)."""

    def add_scalar(self, tag: str, scalar_value: float, global_step: int) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


log = logging.getLogger(__name__)

# Steps this process times before its own pace replaces the plan's in the ETA; the first one (its
# warm-up: kernels, allocator, caches) is left out of the pace once a second one is timed.
MEASURED_STEPS = 3
SPIKE_FACTOR = 2.0  # a step loss this many times the running average is a spike
SPIKE_WARMUP = 5  # logged steps before spikes are judged
EMA_WEIGHT = 0.9


def to_snake(name: str) -> str:
    """`trainedTokens` as a TensorBoard tag spells it: `trained_tokens`."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def emit(event: str, **fields: Any) -> None:
    # One write per line: print() writes the text and its newline apart, and under
    # PYTHONUNBUFFERED two processes sharing the pod's stdout could splice their lines.
    sys.stdout.write(json.dumps({"event": event, **fields}, separators=(",", ":")) + "\n")
    sys.stdout.flush()


class LossSpikes:
    """Running average of the loss; a value far above it is reported as a warning, not an error."""

    def __init__(self) -> None:
        self.average: float | None = None
        self.seen = 0
        self.spikes = 0

    def observe(self, step: int, loss: float) -> None:
        if not math.isfinite(loss):
            return
        self.seen += 1
        if self.average is not None and self.seen > SPIKE_WARMUP and loss > SPIKE_FACTOR * self.average:
            self.spikes += 1
            log.warning("loss spike at step %d: %.4f, running average %.4f", step, loss, self.average)
            emit("LossSpike", step=step, loss=loss, average=round(self.average, 6))
        self.average = loss if self.average is None else EMA_WEIGHT * self.average + (1 - EMA_WEIGHT) * loss


# What status.progress.metrics holds (its schema's limits): the first figures, by short names.
STATUS_METRICS = 16
STATUS_METRIC_NAME = 64


def status_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """The first STATUS_METRICS figures whose names status can hold, in the objective's order
    (its most telling first); TensorBoard and summary.json keep every figure."""
    kept = [(k, v) for k, v in metrics.items() if len(k) <= STATUS_METRIC_NAME]
    return dict(kept[:STATUS_METRICS])


@dataclass(frozen=True)
class Counting:
    """What the training method's steps count and report beside the loss (its TrainingObjective's
    `trained_name`, `metric_tags` and `metrics_text`): the defaults are supervised fine-tuning's."""

    trained_name: str = "trainedTokens"
    metric_tags: Mapping[str, str] = field(default_factory=dict)
    metrics_text: Callable[[Mapping[str, float]], str | None] = lambda _: None


class Progress:
    """Rank 0's account of the run: JSON lines, TensorBoard scalars and status patches."""

    def __init__(
        self,
        reporter: StatusReporter | None,
        tensorboard: Path | None,
        total_steps: int,
        counting: Counting | None = None,
        planned_step_seconds: float | None = None,
    ) -> None:
        """`planned_step_seconds`: the plan's optimizer step (finetune_plan.duration), the ETA's
        pace until this process has timed MEASURED_STEPS steps of its own (None: the CPU)."""
        self.reporter = reporter
        self.total_steps = total_steps
        self.planned_step_seconds = planned_step_seconds
        self.first_step_seconds: float | None = None
        self.counting = counting or Counting()
        self.spikes = LossSpikes()
        self.started: float | None = None
        self.start_step = 0
        self.tokens = 0  # processed by this process since `begin`: the rate's count
        self.run_tokens = 0  # the run's, resumed ones included
        self.trained_tokens = 0  # the run's targets of the loss (pairs, for the preference methods)
        self.last: dict[str, Any] = {}
        self.first_loss: float | None = None
        # The method's figures of the first step this process ran, and of the last one.
        self.first_metrics: dict[str, float] | None = None
        self.final_metrics: dict[str, float] | None = None
        self.reported_metrics: dict[str, float] = {}  # the last progress line's
        self.eval_loss: float | None = None
        self.eval_step: int | None = None
        self.lora: dict[str, Any] | None = None  # what was adapted (families.adapted), for the status
        # The plan's seconds of the evaluation still ahead after a step (its held-out passes and
        # answers), added to the ETA; none where no plan times it.
        self.evaluation_ahead: Callable[[int], float] = lambda _step: 0.0
        self._writer: _Scalars | None = None
        if tensorboard is not None:
            from torch.utils.tensorboard import SummaryWriter

            # torch 2.7 leaves SummaryWriter.__init__ unannotated.
            self._writer = SummaryWriter(log_dir=str(tensorboard))  # type: ignore[no-untyped-call]

    def begin(self, step: int, *, tokens: int = 0, trained: int = 0) -> None:
        """Called before the first step this process runs (after a resume, too, with the
        checkpoint's counts)."""
        self.started = time.monotonic()
        self.start_step = step
        self.run_tokens, self.trained_tokens = tokens, trained

    def step(
        self,
        step: int,
        *,
        loss: float,
        lr: float,
        tokens: int,
        epoch: float,
        report: bool,
        trained: int = 0,
        metrics: dict[str, float] | None = None,
    ) -> None:
        """A finished step; `metrics` are the objective's own figures beside the loss."""
        metrics = metrics or {}
        self.tokens += tokens
        self.run_tokens += tokens
        self.trained_tokens += trained
        if self.first_loss is None:
            self.first_loss = loss
        if metrics:
            self.first_metrics = self.first_metrics or dict(metrics)
            self.final_metrics = dict(metrics)
        counting = self.counting
        if self._writer is not None:
            self._writer.add_scalar("train/loss", loss, step)
            self._writer.add_scalar("train/learning_rate", lr, step)
            self._writer.add_scalar("train/tokens", self.run_tokens, step)
            self._writer.add_scalar(f"train/{to_snake(counting.trained_name)}", self.trained_tokens, step)
            for name, value in metrics.items():
                self._writer.add_scalar(f"train/{counting.metric_tags.get(name, name)}", value, step)
        elapsed = time.monotonic() - (self.started or time.monotonic())
        done = step - self.start_step
        if self.first_step_seconds is None:
            self.first_step_seconds = elapsed
        if not report:
            return
        progress: dict[str, Any] = {
            "step": step,
            "totalSteps": self.total_steps,
            "epoch": round(epoch, 4),
            "loss": loss,
            "lr": lr,
            "tokensPerSecond": round(self.tokens / elapsed, 1) if elapsed > 0 else None,
            "etaSeconds": self.eta(step, elapsed, done),
            # seconds since this process's first step: lets a benchmark drop warm-up steps
            "elapsedSeconds": round(elapsed, 3),
            # The run's counts: every token processed (what tokensPerSecond counts), and the
            # targets of the loss among them (trainOn, completion-only formats, padding rows), or
            # the pairs for a method whose loss is a mean over pairs.
            "tokens": self.run_tokens,
            counting.trained_name: self.trained_tokens,
            **metrics,
        }
        self.last = progress
        self.reported_metrics = {k: v for k, v in metrics.items() if math.isfinite(v)}  # JSON has no NaN
        emit("progress", **progress)
        self.spikes.observe(step, loss)
        if self._writer is not None:
            self._writer.add_scalar("train/tokens_per_second", progress["tokensPerSecond"] or 0.0, step)
        if self.reporter is not None:
            self.reporter.progress(self.status_progress())

    def eta(self, step: int, elapsed: float, done: int) -> float | None:
        """Seconds to the last step: at the plan's pace until MEASURED_STEPS steps are timed,
        then at this process's own, its first step (the warm-up) left out; and the evaluation
        still ahead, by the plan."""
        if done < 1:
            return None
        if done < MEASURED_STEPS and self.planned_step_seconds:
            pace = self.planned_step_seconds
        elif done >= 2 and self.first_step_seconds is not None:
            pace = (elapsed - self.first_step_seconds) / (done - 1)
        else:
            pace = elapsed / done
        return round((self.total_steps - step) * pace + self.evaluation_ahead(step), 1)

    def evaluated(self, step: int, loss: float) -> None:
        self.eval_loss = loss
        self.eval_step = step
        emit("eval", step=step, evalLoss=loss)
        if self._writer is not None:
            self._writer.add_scalar("eval/loss", loss, step)

    def evaluation(self, model: str, step: int, figures: Mapping[str, float | None], seconds: float) -> None:
        """A measure of the base or the tuned model on the held-out split (evaluation/): the
        `evaluation` event and TensorBoard's `evaluation/<model>/<name>` at `step`."""
        shown = {name: value for name, value in figures.items() if value is not None and math.isfinite(value)}
        emit("evaluation", model=model, step=step, figures=shown, seconds=round(seconds, 3))
        if self._writer is not None:
            for name, value in shown.items():
                self._writer.add_scalar(f"evaluation/{model}/{name}", value, step)
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def status_progress(self) -> dict[str, Any]:
        """The last progress line in the shape of `FineTuneJobStatus.progress`."""
        p = self.last
        if not p:
            return {}
        total = p["totalSteps"] or 0
        percent = round(100.0 * p["step"] / total, 1) if total else None
        loss = p["loss"] if math.isfinite(p["loss"]) else None
        # The held-out loss of the last evaluation (each checkpoint's, and the end's): it goes out
        # with the next patch, which the checkpoint right after the evaluation sends.
        eval_loss = self.eval_loss if self.eval_loss is not None and math.isfinite(self.eval_loss) else None
        out = {
            "step": p["step"],
            "totalSteps": total,
            "epoch": p["epoch"],
            "percent": percent,
            "loss": loss,
            # What `kubectl get ftj` shows (a printer column cannot format a number).
            "percentText": f"{percent:.1f}%" if percent is not None else None,
            "lossText": f"{loss:.4g}" if loss is not None else None,
            "evalLoss": eval_loss,
            "evalLossText": f"{eval_loss:.4g}" if eval_loss is not None else None,
            "evalStep": self.eval_step if eval_loss is not None else None,
            "learningRate": p["lr"],
            "tokensPerSecond": p["tokensPerSecond"],
            "etaSeconds": p["etaSeconds"],
            "tokens": p["tokens"],
            self.counting.trained_name: p[self.counting.trained_name],
            "metrics": status_metrics(self.reported_metrics) or None,
            "metricsText": self.counting.metrics_text(self.reported_metrics) if self.reported_metrics else None,
            "loraModules": self.lora["modules"] if self.lora else None,
            "loraLayers": self.lora["layers"] if self.lora else None,
        }
        return {k: v for k, v in out.items() if v is not None}

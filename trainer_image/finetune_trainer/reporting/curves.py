"""The run's loss curve as a picture beside the adapter, and the eval figures of the whole run.

Read back from the run's TensorBoard files (`progress.py` writes them), not from this process's
memory: every attempt of the job appends its own file, and TensorBoard's reader drops the steps an
attempt logged after its last checkpoint when the next one logs them again, so the curve of a
resumed run starts at step 1 and has each step once. Drawn headless (matplotlib's Agg canvas,
no pyplot and no display): training loss and held-out loss by step, the learning rate on an axis
of its own.

A picture is a courtesy: one that cannot be drawn (no points, a broken file) is logged and the
job still succeeds with its adapter.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TRAIN_LOSS = "train/loss"
EVAL_LOSS = "eval/loss"
LEARNING_RATE = "train/learning_rate"


@dataclass(frozen=True)
class History:
    """Each tag's value by step, over every attempt of the run."""

    train: dict[int, float] = field(default_factory=dict)
    eval: dict[int, float] = field(default_factory=dict)
    lr: dict[int, float] = field(default_factory=dict)

    def eval_summary(self) -> dict[str, Any]:
        """summary.json's eval figures: the last and the best held-out loss, and the best's step."""
        finite = {step: loss for step, loss in self.eval.items() if math.isfinite(loss)}
        if not finite:
            return {"finalEvalLoss": None, "bestEvalLoss": None, "bestEvalStep": None}
        best = min(finite, key=lambda step: (finite[step], step))
        return {"finalEvalLoss": finite[max(finite)], "bestEvalLoss": finite[best], "bestEvalStep": best}


def read(folder: Path) -> History:
    """The scalars of every event file in `folder`; an empty History where there is none."""
    if not folder.is_dir():
        return History()
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator  # type: ignore[import-untyped]

    # Its reader says at INFO level that it reached the end of each file: nothing for the pod's log.
    logging.getLogger("tensorboard").setLevel(logging.WARNING)
    # Every scalar kept (the reader samples 10,000 by default); orphaned steps purged on a resume.
    events = EventAccumulator(str(folder), size_guidance={SCALARS: 0})
    events.Reload()
    tags = set(events.Tags().get("scalars") or ())

    def values(tag: str) -> dict[int, float]:
        return {int(e.step): float(e.value) for e in events.Scalars(tag)} if tag in tags else {}

    return History(values(TRAIN_LOSS), values(EVAL_LOSS), values(LEARNING_RATE))


def draw(history: History, out: Path, title: str) -> Path:
    """The curve as a PNG at `out` (written beside, then renamed: never half a file)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.0, 4.2), dpi=100)
    FigureCanvasAgg(figure)
    loss = figure.subplots()
    steps = sorted(history.train)
    loss.plot(steps, [history.train[s] for s in steps], linewidth=1.4, label="training loss")
    if history.eval:
        held = sorted(history.eval)
        loss.plot(held, [history.eval[s] for s in held], marker="o", linewidth=1.4, label="eval loss")
    loss.set_xlabel("optimizer step")
    loss.set_ylabel("loss")
    loss.grid(True, alpha=0.3)
    if history.lr:
        rate = loss.twinx()
        marked = sorted(history.lr)
        rate.plot(marked, [history.lr[s] for s in marked], color="grey", linestyle="--", linewidth=1, label="lr")
        rate.set_ylabel("learning rate")
        rate.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    handles = [h for ax in figure.axes for h in ax.get_legend_handles_labels()[0]]
    loss.legend(handles, [str(h.get_label()) for h in handles], loc="upper right")
    loss.set_title(title)
    figure.tight_layout()
    temp = out.with_name(f".{out.name}.tmp")
    figure.savefig(temp, format="png")
    temp.rename(out)
    return out


def write(tensorboard: Path, out: Path, title: str) -> tuple[Path | None, History]:
    """Read the run's history and draw it at `out`; (None, what was read) where it cannot be drawn."""
    try:
        history = read(tensorboard)
    except Exception as exc:  # a broken event file costs the picture, never the job
        log.warning("loss curve: cannot read %s: %s", tensorboard, exc)
        return None, History()
    if len(history.train) < 2:
        log.info("loss curve: fewer than two logged steps in %s, no picture", tensorboard)
        return None, history
    try:
        return draw(history, out, title), history
    except Exception as exc:
        log.warning("loss curve: cannot draw %s: %s", out, exc)
        return None, history

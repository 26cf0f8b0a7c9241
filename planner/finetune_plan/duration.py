"""How long a job trains, by its plan: one optimizer step, and the whole job.

`ftjob plan` says the whole job's time on its first lines; the trainer's progress gives its ETA
from the plan's optimizer step until it has measured steps of its own. Both take the step from
here, so the two agree until the run knows better.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune_api.spec import FineTuneJobSpec

from .results.plan import Plan


def optimizer_step_seconds(plan: Plan, accumulation: int) -> float | None:
    """One optimizer step: every process runs `accumulation` micro-batches of the plan's length,
    all processes (and pods) at once; None where the plan has no speed."""
    return plan.speed.step_seconds * accumulation if plan.speed is not None else None


@dataclass(frozen=True)
class JobTime:
    seconds: float | None  # None: not known before the dataset's size is
    how: str


def job_time(plan: Plan, spec: FineTuneJobSpec, epoch_tokens: int | None) -> JobTime:
    """The whole job: `training.maxSteps` optimizer steps, else its epochs over `epoch_tokens`
    tokens (every pod's processes at the plan's speed). Rows shorter than maxLength make it
    shorter: each micro-batch is planned at full length."""
    training = spec.training
    step = optimizer_step_seconds(plan, training.gradient_accumulation)
    if training.max_steps is not None and step is not None:
        return JobTime(
            training.max_steps * step, f"{training.max_steps:,} steps (training.maxSteps) of {step:.3g} s each"
        )
    epochs = training.epochs or 1.0
    speed = plan.speed
    if epoch_tokens and speed is not None and speed.tokens_per_second > 0:
        rate = speed.tokens_per_second * spec.resources.nodes
        return JobTime(
            epochs * epoch_tokens / rate, f"{epochs:g} epoch(s) of {epoch_tokens:,} tokens at {rate:,.0f} tokens/s"
        )
    each = f" (each optimizer step {step:.3g} s)" if step is not None else ""
    return JobTime(None, f"{epochs:g} epoch(s) of a dataset whose size is not known here{each}")

"""How long a job trains, by its plan: one optimizer step, and the whole job.

`ftjob plan` says the whole job's time on its first lines; the trainer's progress gives its ETA
from the plan's optimizer step until it has measured steps of its own. Both take the step from
here, so the two agree until the run knows better.
"""

from __future__ import annotations

from dataclasses import dataclass

from finetune_api.spec import FineTuneJobSpec

from .grpo.spec import terms_of
from .grpo.step import optimizer_steps
from .results.plan import Plan


def optimizer_step_seconds(plan: Plan, accumulation: int) -> float | None:
    """One optimizer step: every process runs `accumulation` micro-batches of the plan's length,
    all processes (and pods) at once; None where the plan has no speed."""
    return plan.speed.step_seconds * accumulation if plan.speed is not None else None


@dataclass(frozen=True)
class JobTime:
    seconds: float | None  # None: not known before the dataset's size is
    how: str


def job_time(
    plan: Plan, spec: FineTuneJobSpec, epoch_tokens: int | None, *, records: int | None = None, processes: int = 1
) -> JobTime:
    """The whole job: `training.maxSteps` optimizer steps, else its epochs over `epoch_tokens`
    tokens (every pod's processes at the plan's speed); GRPO's over its `records` prompts, in
    optimizer steps (`grpo_time`). Rows shorter than maxLength make it shorter: each micro-batch
    is planned at full length."""
    training = spec.training
    step = optimizer_step_seconds(plan, training.gradient_accumulation)
    if training.max_steps is not None and step is not None:
        return JobTime(
            training.max_steps * step, f"{training.max_steps:,} steps (training.maxSteps) of {step:.3g} s each"
        )
    if plan.recipe.grpo is not None:
        return grpo_time(spec, step, records, processes)
    epochs = training.epochs or 1.0
    speed = plan.speed
    if epoch_tokens and speed is not None and speed.tokens_per_second > 0:
        rate = speed.tokens_per_second * spec.resources.nodes
        return JobTime(
            epochs * epoch_tokens / rate, f"{epochs:g} epoch(s) of {epoch_tokens:,} tokens at {rate:,.0f} tokens/s"
        )
    each = f" (each optimizer step {step:.3g} s)" if step is not None else ""
    return JobTime(None, f"{epochs:g} epoch(s) of a dataset whose size is not known here{each}")


def grpo_time(spec: FineTuneJobSpec, step: float | None, records: int | None, processes: int) -> JobTime:
    """GRPO's job without maxSteps: its optimizer steps over `records` prompts (`processes` in
    each pod), each batch of rollouts serving numIterations of them, at `step` seconds each."""
    steps = optimizer_steps(spec, records, processes)
    terms = terms_of(spec.training)
    iterations = 1 if terms is None else terms.num_iterations
    shared = f", each batch of rollouts serving {iterations} steps" if iterations > 1 else ""
    epochs = f"{spec.training.epochs or 1.0:g} epoch(s)"
    each = f"{step:.3g} s" if step is not None else "a time not planned"
    if steps is None or step is None or records is None:
        return JobTime(None, f"{epochs} of prompts whose count is not known here (each optimizer step {each})")
    return JobTime(steps * step, f"{steps:,} optimizer steps ({epochs} of {records:,} prompts{shared}) of {each} each")

"""The resume stage: the latest complete checkpoint restored, if any (`resume`), then what
reports while training and the loop that runs the steps, and the `start` event (`start`)."""

from __future__ import annotations

import logging
from functools import partial as bind
from typing import Any

from finetune_api.layout import TENSORBOARD_DIR
from finetune_plan.duration import optimizer_step_seconds

from ..reporting.progress import Counting, Progress, emit
from ..reporting.status_patch import StatusReporter
from ..state import fingerprint
from ..state.checkpoints import CheckpointStore
from ..state.resume import resume_point
from ..state.train_state import load as load_state
from .loop import Loop
from .recipe_outputs import checkpoint_ref
from .run_state import Live, Loaded, Position, Run, Setup

log = logging.getLogger(__name__)


def resume(run: Run, loaded: Loaded) -> Position:
    """Where training starts: the latest checkpoint's step, counts and any stopped step to finish."""
    ranks, training = run.ranks, run.spec.training
    position = Position()
    saved: dict[str, Any] = {}
    # Ranks in other pods restore from rank 0's copy: they may not see this volume.
    with resume_point(loaded.store, ranks) as point:
        if point is not None:
            position.step, position.tokens, saved, position.partial = load_state(
                point.path, loaded.adapter, loaded.optimizer, loaded.scheduler
            )
    position.resume_from = point
    position.trained_tokens = int(saved.get("trainedTokens", 0))
    if point is None:
        return position
    log.info(
        "resuming from %s (%s), written by %s process(es) in %s",
        point.name,
        point.path,
        saved.get("worldSize"),
        saved.get("parallelism"),
    )
    partial = position.partial
    if partial is not None and not partial.fits(ranks.world_size, training.gradient_accumulation):
        log.warning(
            "%s stopped inside step %d on %d process(es) with accumulation %d; on %d with %d its"
            " micro-batches are numbered otherwise, so step %d runs again from its start",
            point.name,
            partial.step + 1,
            partial.world_size,
            partial.accumulation,
            ranks.world_size,
            training.gradient_accumulation,
            partial.step + 1,
        )
        position.partial = None
    return position


def start(run: Run, setup: Setup, loaded: Loaded, position: Position) -> Live:
    """The reporter, the progress, the loop in the mode, and the `start` event."""
    reporter = StatusReporter.from_environment(run.config.job_name, run.config.namespace) if run.main else None
    objective = run.objective
    counting = Counting(objective.trained_name, objective.metric_tags, objective.metrics_text)
    plan = setup.launch.plan
    progress = Progress(
        reporter,
        run.output / TENSORBOARD_DIR if run.main else None,
        loaded.schedule.total_steps,
        counting,
        # The ETA's pace until this process has timed steps of its own: the plan's step.
        optimizer_step_seconds(plan, run.spec.training.gradient_accumulation) if plan is not None else None,
    )
    progress.lora = loaded.lora
    loop = _loop(run, setup, loaded)
    # The base's fingerprint, by which a ModelServer tells this job's adapter from another base's.
    identity = fingerprint.base_identity(run.config) if reporter is not None else None
    if reporter is not None and identity is not None:
        reporter.model_fingerprint(identity)
    resumed = position.resume_from
    if reporter is not None and resumed is not None:
        # What exists from the start of this attempt on, not only once it writes its own.
        reporter.checkpoint(resumed.step, str(resumed.path), resumed.time)
    if run.main:
        emit(
            "start",
            job=run.config.job_name,
            hardware=setup.hardware.describe(),
            precision=setup.precision,
            attention=setup.attention,
            family=setup.family.label,
            lora=loaded.lora,
            parallelism=setup.launch.parallelism,
            worldSize=run.ranks.world_size,
            memoryPlan=setup.plan.source,
            resumeFrom=checkpoint_ref(resumed) if resumed else None,
            samples=len(loaded.train_samples),
            rows=len(loaded.rows),
            evalSamples=len(loaded.eval_samples) if loaded.eval_samples else 0,
        )
    return Live(reporter, progress, loop)


def _loop(run: Run, setup: Setup, loaded: Loaded) -> Loop:
    """The loop that runs the steps and the evaluation, in the mode, on the loop's device."""
    training = run.spec.training
    return Loop(
        model=loaded.trained,
        head=loaded.head,
        adapter=loaded.adapter,
        optimizer=loaded.optimizer,
        scheduler=loaded.scheduler,
        objective=run.objective,
        schedule=loaded.schedule,
        rows=loaded.rows,
        eval_rows=loaded.eval_rows,
        topology=run.ranks,
        device=setup.mode.loop_device(setup.device),
        pad_id=int(setup.tokenizer.pad_token_id),
        packed=training.packing,
        seed=training.seed,
        max_grad_norm=training.max_grad_norm,
        eval_batch_size=setup.decided.savers(run.config).eval_batch_size,
        mode=setup.mode,
        guard=loaded.guard,
        probe=setup.probe if setup.probe.enabled else None,
        last_checkpoint=bind(_kept, loaded.store),
    )


def _kept(store: CheckpointStore) -> str:
    """The last good checkpoint, as a failure's message names it."""
    last = store.latest()
    return f"last good checkpoint: step {last.step} ({last.path})" if last else "no checkpoint written yet"

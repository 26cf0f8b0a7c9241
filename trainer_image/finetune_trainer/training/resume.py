"""The resume stage: the latest complete checkpoint restored, if any (`resume`), then what
reports while training and the loop that runs the steps, and the `start` event (`start`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial as bind
from typing import Any

from finetune_api.layout import EVALUATION_FILE, TENSORBOARD_DIR
from finetune_plan.duration import optimizer_step_seconds
from finetune_plan.evaluation import evaluation_time
from finetune_plan.results.plan import Plan

from ..distributed.gradsync import sum_figures
from ..evaluation import files
from ..evaluation.generation import Answering
from ..evaluation.stages import Evaluation
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
    if plan is not None and loaded.eval_rows:
        progress.evaluation_ahead = _evaluation_ahead(plan, run, loaded)
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
    return Live(reporter, progress, loop, _evaluation(run, setup, loaded, progress, loop))


def _evaluation(run: Run, setup: Setup, loaded: Loaded, progress: Progress, loop: Loop) -> Evaluation | None:
    """The base against the tuned model on the held-out split (evaluation/), with what an
    earlier attempt measured read back; None without a held-out split."""
    spec, samples = run.spec, loaded.eval_samples
    if not samples or not loaded.eval_rows:
        return None
    rows: list[Any] = list(loaded.eval_rows)
    if spec.training.packing:  # one row per held-out example: its index is the example's
        unpacked = spec.model_copy(update={"training": spec.training.model_copy(update={"packing": False})})
        rows = run.objective.rows(samples, setup.tokenizer, unpacked)
    split = "dataset.eval" if spec.dataset.eval is not None else "evalFraction"
    record = files.Record(spec.training.method, split, len(rows))
    path = run.output / EVALUATION_FILE if run.main else None  # beside the adapter
    if path is not None:
        record = files.earlier(path, record)
    answering = Answering(
        loaded.adapter.peft_model,
        loaded.head,
        setup.tokenizer,
        setup.mode.loop_device(setup.device),
        run.ranks,
        runner=loaded.trained if setup.mode.sharded else None,
    )
    # Every rank must know whether the base is measured already: rank 0 alone reads the file.
    (known,) = sum_figures([1.0 if record.base.get("loss") is not None else 0.0], run.ranks.world_size, loop.device)
    return Evaluation(
        loop.held_out(),
        rows,
        [dict(sample) for sample in samples],
        answering,
        spec.evaluation,
        record,
        lambda: run.stop.requested,
        base_known=known > 0,
        path=path,
        progress=progress if run.main else None,
    )


def _evaluation_ahead(plan: Plan, run: Run, loaded: Loaded) -> Callable[[int], float]:
    """The plan's seconds of the held-out passes and answers still ahead after a step
    (`finetune_plan.evaluation`: the loss at each checkpoint by steps, the tuned model at those
    before the last with atCheckpoints and after training, both models' answers)."""
    spec, total = run.spec, loaded.schedule.total_steps
    timed = evaluation_time(plan, spec, len(loaded.eval_samples or ()), total_steps=total)
    every, at_checkpoints = spec.checkpoints.every_steps, spec.evaluation.at_checkpoints
    if timed is None:
        return lambda _step: 0.0
    return lambda step: timed.ahead(step, total, every, at_checkpoints=at_checkpoints) or 0.0


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

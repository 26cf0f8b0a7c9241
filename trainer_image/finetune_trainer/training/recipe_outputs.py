"""What the recipe's stages write: checkpoints, the adapter and its formats, the sample answers
and the run's summary, each from the parts of the run's state it reads (`run_state`)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from finetune_api.layout import LOSS_CURVE_FILE, SAMPLES_FILE, TENSORBOARD_DIR

from .. import faults
from ..outputs import samples
from ..outputs.export import public_name, save_adapter, save_formats, write_summary
from ..reporting import curves, report
from ..reporting.progress import emit
from ..state import fingerprint
from ..state.checkpoints import Checkpoint, checkpoint_name
from ..state.train_state import Partial
from ..state.train_state import Progress as SavedProgress
from ..state.train_state import save as save_state
from .run_state import Finished, Loaded, Run, Setup, State, Written

log = logging.getLogger(__name__)


def checkpoint_ref(checkpoint: Checkpoint) -> dict[str, Any]:
    ref: dict[str, Any] = {"step": checkpoint.step, "path": str(checkpoint.path), "time": checkpoint.time}
    if checkpoint.micro:
        ref["microBatchesDone"] = checkpoint.micro
    return ref


# --- checkpoint ------------------------------------------------------------------------------------
def write_checkpoint(state: State, step: int, partial: Partial | None) -> None:
    """Rank 0 writes the checkpoint atomically (staging, fsync, marker, rename): the adapter,
    its optimizer and scheduler, the progress and any partial step, in every mode."""
    run, loaded, position, live = state.run, state.loaded, state.position, state.live
    micro = partial.micro_done if partial else 0
    staging = loaded.store.begin(step, micro) / checkpoint_name(step, micro)
    progress_now = SavedProgress(
        step, position.tokens, run.ranks.world_size, state.setup.launch.parallelism, position.trained_tokens
    )
    save_state(staging, loaded.adapter, loaded.optimizer, loaded.scheduler, progress_now, partial=partial)
    fingerprint.write(staging, fingerprint.record(run.asked, state.setup.fingerprint))
    faults.current().in_save(step)
    checkpoint = loaded.store.commit(step, micro)
    log.info("checkpoint %d complete: %s", step, checkpoint.path)
    emit("checkpoint", **checkpoint_ref(checkpoint))
    if live.reporter is not None:
        live.reporter.progress(live.progress.status_progress())
        live.reporter.checkpoint(checkpoint.step, str(checkpoint.path), checkpoint.time)


# --- export ----------------------------------------------------------------------------------------
def export(state: State, rows: list[dict[str, str]] | None = None) -> Written:
    """Rank 0: the adapter (and the merged model when asked), the sample answers (`rows`
    when every rank answered them already), the last status."""
    run, setup, live = state.run, state.setup, state.live
    try:
        adapter_path = save_adapter(state.loaded.adapter, setup.tokenizer, run.output, public_name(run.config))
        samples_path = _write_samples(state, adapter_path, rows)
        exported = save_formats(run.config, adapter_path, setup.tokenizer, run.output)
        if live.reporter is not None:
            live.reporter.progress(live.progress.status_progress())
    finally:
        live.cleanup()
    return Written(adapter_path, samples_path, exported)


def sample_rows(run: Run, setup: Setup, loaded: Loaded) -> list[dict[str, str]] | None:
    """output.samples' greedy answers with and without the adapter; None when none are asked.
    Rank 0 alone runs this after training, except under fsdp, where each rank holds a shard of
    the model and every rank runs it, in lockstep on the same prompts."""
    asked = run.spec.output.samples
    if asked.count == 0 and not asked.sample_prompts:
        return None
    pools = [loaded.eval_samples, loaded.train_samples]
    prompts = samples.choose_prompts(asked.sample_prompts, asked.count, pools, setup.tokenizer)
    if not prompts:
        return None
    return samples.answer(
        loaded.adapter.peft_model,
        loaded.head,
        setup.tokenizer,
        prompts,
        max_new_tokens=asked.max_new_tokens,
        device=setup.mode.loop_device(setup.device),
        runner=loaded.trained if setup.mode.sharded else None,
    )


def _write_samples(state: State, adapter_path: Path, rows: list[dict[str, str]] | None) -> Path | None:
    """Rank 0: samples.jsonl beside the adapter and the first answer into status.sample."""
    if rows is None and not state.setup.mode.sharded:
        rows = sample_rows(state.run, state.setup, state.loaded)
    if not rows:
        return None
    path = samples.write(adapter_path.parent / SAMPLES_FILE, rows)
    emit("samples", path=str(path), count=len(rows))
    reporter = state.live.reporter
    if reporter is not None:
        reporter.sample(samples.status_sample(rows, path))
    return path


# --- summary ---------------------------------------------------------------------------------------
def _memory_parts(setup: Setup) -> dict[str, Any] | None:
    """This GPU's plan, part by part, beside the parts the probe measured (memory/phases.py);
    None where the probe did not run (the CPU, deviceMap's one process over several GPUs)."""
    measured, plan = setup.probe.summary(), setup.launch.plan
    if measured is None or plan is None:
        return None
    planned = plan.per_gpu[min(setup.device.index or 0, len(plan.per_gpu) - 1)]
    return {"gpu": str(setup.device), "planned": planned.parts_gib(), "measured": measured}


# What the `done` event repeats of the summary.
DONE_FIELDS = frozenset(
    {
        "finalStep",
        "finalLoss",
        "evalLoss",
        "bestEvalLoss",
        "adapterPath",
        "lossCurvePath",
        "reportPath",
        "precisionGuard",
    }
)


def summary(state: State, finished: Finished, written: Written) -> dict[str, Any]:
    """Rank 0: summary.json and the `done` event."""
    run, setup, loaded, position = state.run, state.setup, state.loaded, state.position
    progress, reporter, latest = state.live.progress, state.live.reporter, loaded.store.latest()
    formats, host = written.exported.written, finished.host_peaks
    name = f"{run.config.namespace + '/' if run.config.namespace else ''}{run.config.job_name}"
    curve, history = curves.write(run.output / TENSORBOARD_DIR, run.output / LOSS_CURVE_FILE, f"FineTuneJob {name}")
    summary = {
        "job": run.config.job_name,
        "finalStep": position.step,
        "totalSteps": loaded.schedule.total_steps,
        "firstLoss": progress.first_loss,
        "finalLoss": progress.last.get("loss"),
        "evalLoss": progress.eval_loss,
        # The whole run's held-out losses (every attempt's): the last, the best and its step.
        **history.eval_summary(),
        "lossCurvePath": str(curve) if curve else None,
        "tokensPerSecond": progress.last.get("tokensPerSecond"),
        "tokens": position.tokens,
        # Targets of the loss, or pairs for a method whose loss is a mean over pairs (dpo, orpo).
        run.objective.trained_name: position.trained_tokens,
        # The method's own figures (dpo, orpo: rewards, log-probabilities) of this process's
        # first step and of the last step; None for a method without any.
        "firstMetrics": progress.first_metrics,
        "finalMetrics": progress.final_metrics,
        "adapterPath": str(written.adapter_path),
        "mergedPath": str(written.merged) if written.merged else None,
        "formats": {name: str(path) for name, path in formats.items()},
        # The formats not written, and why: the job still succeeds with its adapter.
        "exportFailures": written.exported.failed or None,
        "samplesPath": str(written.samples_path) if written.samples_path else None,
        "resumedFrom": checkpoint_ref(position.resume_from) if position.resume_from else None,
        "lastCheckpoint": checkpoint_ref(latest) if latest else None,
        "parallelism": setup.launch.parallelism,
        "worldSize": run.ranks.world_size,
        "ranksInStep": finished.in_step,
        "precision": setup.precision,
        "attention": setup.attention,
        "family": setup.family.label,
        "lora": loaded.lora,
        "hardware": setup.hardware.describe(),
        "gpuStack": setup.facts,
        "memoryPlan": {"source": setup.plan.source, **setup.plan.summary},
        # The tighter savers this run took after an OOM (oom_retry.py), else None.
        "oomRetry": setup.decided.retry.describe() if setup.decided.retry is not None else None,
        "precisionGuard": loaded.guard.summary() if loaded.guard is not None else None,
        "data": setup.data.summary(),
        "lossSpikes": progress.spikes.spikes,
        "statusPatches": {"sent": reporter.sent, "failed": reporter.failed} if reporter else None,
        "peakGiBPerGpu": finished.peaks,
        "memoryParts": _memory_parts(setup),
        # Resident counts the model files' mapped pages (page cache, shared, droppable);
        # anonymous is what each process holds itself.
        "peakHostGiBPerProcess": host.resident,
        "peakHostAnonGiBPerProcess": host.anonymous,
        # Pinned (offloaded activations): locked, outside both of the above, in the pod's cgroup.
        "peakPinnedHostGiBPerProcess": host.pinned,
        # The checkpoint bytes every process of the job read, summed: once the checkpoint's
        # tensors when fsdp streams it, the files' size per process otherwise.
        "modelBytesRead": host.bytes_read,
        "loadSeconds": round(loaded.loaded_s, 1),
        "seconds": round(time.time() - run.started, 1),
    }
    # The page a person reads (reporting/report.py): the curve above, evaluation.json's table and answers.
    settings = run.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    page = report.write(run.output, summary, settings, f"FineTuneJob {name}")
    summary["reportPath"] = str(page) if page else None
    write_summary(run.output, summary)
    emit("done", **{k: v for k, v in summary.items() if k in DONE_FIELDS})
    return summary

"""The recipe's writing stages (`recipe.Recipe`): checkpoints, the adapter and its formats, the
sample answers and the run's summary. A mixin: the state these stages read (the adapter, the
store, the progress, the plan) lives on the recipe, set by its earlier stages; kept apart so the
recipe's class holds the order of the stages and this one what each writes.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from finetune_api.contract import SAMPLES_FILE

from . import fingerprint, samples, test_hooks
from .checkpoints import Checkpoint, checkpoint_name
from .distributed import topology
from .export import public_name, save_adapter, save_formats, write_summary
from .progress import emit
from .train_state import Partial
from .train_state import Progress as SavedProgress
from .train_state import save as save_state

log = logging.getLogger(__name__)


def checkpoint_ref(checkpoint: Checkpoint) -> dict[str, Any]:
    ref: dict[str, Any] = {"step": checkpoint.step, "path": str(checkpoint.path), "time": checkpoint.time}
    if checkpoint.micro:
        ref["microBatchesDone"] = checkpoint.micro
    return ref


class Outputs:
    """What the recipe writes, checkpoints to summary (its attributes are the recipe's)."""

    # The recipe's state these stages read, set by `Recipe`'s earlier stages.
    main: bool
    step: int
    tokens: int
    trained_tokens: int

    # --- checkpoint ----------------------------------------------------------------------------
    def save_checkpoint(self, at: int, partial: Partial | None = None) -> str:
        """Rank 0 writes, every rank waits for it; returns the checkpoint's name."""
        name = checkpoint_name(at, partial.micro_done if partial else 0)
        if self.main:
            self._write_checkpoint(at, partial)
        topology.barrier(self.ranks)
        self.clock.reset()
        return name

    def _write_checkpoint(self, step: int, partial: Partial | None) -> None:
        """Rank 0 writes the checkpoint atomically (staging, fsync, marker, rename): the adapter,
        its optimizer and scheduler, the progress and any partial step, in every mode."""
        micro = partial.micro_done if partial else 0
        staging = self.store.begin(step, micro) / checkpoint_name(step, micro)
        progress_now = SavedProgress(
            step, self.tokens, self.ranks.world_size, self.launch.parallelism, self.trained_tokens
        )
        save_state(staging, self.adapter, self.optimizer, self.scheduler, progress_now, partial=partial)
        fingerprint.write(staging, fingerprint.record(self.asked, self.fingerprint))
        test_hooks.die_in_save(step)
        checkpoint = self.store.commit(step, micro)
        log.info("checkpoint %d complete: %s", step, checkpoint.path)
        emit("checkpoint", **checkpoint_ref(checkpoint))
        if self.reporter is not None:
            self.reporter.progress(self.progress.status_progress())
            self.reporter.checkpoint(checkpoint.step, str(checkpoint.path), checkpoint.time)

    # --- export --------------------------------------------------------------------------------
    def export(self, rows: list[dict[str, str]] | None = None) -> None:
        """Rank 0: the adapter (and the merged model when asked), the sample answers (`rows`
        when every rank answered them already), the last status."""
        try:
            self.adapter_path = save_adapter(self.adapter, self.tokenizer, self.output, public_name(self.config))
            self.samples_path = self._write_samples(rows)
            exported = save_formats(self.config, self.adapter_path, self.tokenizer, self.output)
            self.formats, self.export_failures = exported.written, exported.failed
            self.merged = self.formats.get("merged")
            if self.reporter is not None:
                self.reporter.progress(self.progress.status_progress())
        finally:
            self.cleanup()

    def _sample_rows(self) -> list[dict[str, str]] | None:
        """output.samples' greedy answers with and without the adapter; None when none are asked.
        Rank 0 alone runs this after training, except under fsdp, where each rank holds a shard of
        the model and every rank runs it, in lockstep on the same prompts."""
        asked = self.spec.output.samples
        if asked.count == 0 and not asked.sample_prompts:
            return None
        pools = [self.eval_samples, self.train_samples]
        prompts = samples.choose_prompts(asked.sample_prompts, asked.count, pools, self.tokenizer)
        if not prompts:
            return None
        return samples.answer(
            self.adapter.peft_model,
            self.head,
            self.tokenizer,
            prompts,
            max_new_tokens=asked.max_new_tokens,
            device=self.mode.loop_device(self.device),
            runner=self.trained if self.mode.sharded else None,
        )

    def _write_samples(self, rows: list[dict[str, str]] | None) -> Path | None:
        """Rank 0: samples.jsonl beside the adapter and the first answer into status.sample."""
        if rows is None and not self.mode.sharded:
            rows = self._sample_rows()
        if not rows:
            return None
        path = samples.write(self.adapter_path.parent / SAMPLES_FILE, rows)
        emit("samples", path=str(path), count=len(rows))
        if self.reporter is not None:
            self.reporter.sample(samples.status_sample(rows, path))
        return path

    # --- summary -------------------------------------------------------------------------------
    def _memory_parts(self) -> dict[str, Any] | None:
        """This GPU's plan, part by part, beside the parts the probe measured (memory_phases.py);
        None where the probe did not run (the CPU, deviceMap's one process over several GPUs)."""
        measured, plan = self.probe.summary(), self.launch.plan
        if measured is None or plan is None:
            return None
        planned = plan.per_gpu[min(self.device.index or 0, len(plan.per_gpu) - 1)]
        return {"gpu": str(self.device), "planned": planned.parts_gib(), "measured": measured}

    def summary(self) -> dict[str, Any]:
        """Rank 0: summary.json and the `done` event."""
        progress, reporter, latest = self.progress, self.reporter, self.store.latest()
        summary = {
            "job": self.config.job_name,
            "finalStep": self.step,
            "totalSteps": self.schedule.total_steps,
            "firstLoss": progress.first_loss,
            "finalLoss": progress.last.get("loss"),
            "evalLoss": progress.eval_loss,
            "tokensPerSecond": progress.last.get("tokensPerSecond"),
            "tokens": self.tokens,
            # Targets of the loss, or pairs for a method whose loss is a mean over pairs (dpo, orpo).
            self.objective.trained_name: self.trained_tokens,
            # The method's own figures (dpo, orpo: rewards, log-probabilities) of this process's
            # first step and of the last step; None for a method without any.
            "firstMetrics": progress.first_metrics,
            "finalMetrics": progress.final_metrics,
            "adapterPath": str(self.adapter_path),
            "mergedPath": str(self.merged) if self.merged else None,
            "formats": {name: str(path) for name, path in self.formats.items()},
            # The formats not written, and why: the job still succeeds with its adapter.
            "exportFailures": self.export_failures or None,
            "samplesPath": str(self.samples_path) if self.samples_path else None,
            "resumedFrom": checkpoint_ref(self.resume_from) if self.resume_from else None,
            "lastCheckpoint": checkpoint_ref(latest) if latest else None,
            "parallelism": self.launch.parallelism,
            "worldSize": self.ranks.world_size,
            "ranksInStep": self.in_step,
            "precision": self.precision,
            "attention": self.attention,
            "family": self.family.label,
            "lora": self.lora,
            "hardware": self.hardware.describe(),
            "gpuStack": self.facts,
            "memoryPlan": {"source": self.plan.source, **self.plan.summary},
            # The tighter savers this run took after an OOM (oom_retry.py), else None.
            "oomRetry": self.decided.retry.describe() if self.decided.retry is not None else None,
            "precisionGuard": self.guard.summary() if self.guard is not None else None,
            "data": self.data.summary(),
            "lossSpikes": progress.spikes.spikes,
            "statusPatches": {"sent": reporter.sent, "failed": reporter.failed} if reporter else None,
            "peakGiBPerGpu": self.peaks,
            "memoryParts": self._memory_parts(),
            # Resident counts the model files' mapped pages (page cache, shared, droppable);
            # anonymous is what each process holds itself.
            "peakHostGiBPerProcess": self.host_peaks["resident"],
            "peakHostAnonGiBPerProcess": self.host_peaks["anonymous"],
            # Pinned (offloaded activations): locked, outside both of the above, in the pod's cgroup.
            "peakPinnedHostGiBPerProcess": self.host_peaks["pinned"],
            # The checkpoint bytes every process of the job read, summed: once the checkpoint's
            # tensors when fsdp streams it, the files' size per process otherwise.
            "modelBytesRead": self.host_peaks["bytesRead"],
            "loadSeconds": round(self.loaded_s, 1),
            "seconds": round(time.time() - self.started, 1),
        }
        write_summary(self.output, summary)
        ending = ("finalStep", "finalLoss", "evalLoss", "adapterPath", "precisionGuard")
        emit("done", **{k: v for k, v in summary.items() if k in ending})
        return summary

"""The train stage: the optimizer steps to the end, checkpointing and evaluating along the way;
a stop request (SIGTERM) ends it with a checkpoint of the point reached, an OOM with where it
happened and the peak against the plan."""

from __future__ import annotations

from collections.abc import Callable

import torch

from finetune_api.reasons import ExitReason
from finetune_plan.memory import GIB

from .. import faults
from ..distributed import topology
from ..distributed.gradsync import all_equal, sum_figures
from ..distributed.topology import Topology
from ..failures import TrainerFailure
from ..hardware.host_memory import HostMemory
from ..memory.oom_retry import at_step
from ..reporting.progress import emit
from ..state.checkpoints import checkpoint_name
from ..state.stopping import CheckpointClock, interrupted
from ..state.train_state import Partial
from .loop import StepFigures
from .recipe_outputs import write_checkpoint
from .run_state import Finished, HostPeaks, State


class Steps:
    """The steps of one run, from its position to the schedule's end; what only they track (the
    checkpoint clock, the last step saved or evaluated) lives here."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.run, self.setup, self.loaded = state.run, state.setup, state.loaded
        self.position, self.live = state.position, state.live
        # From the first step on: `checkpoints.everyMinutes` counts training time, not loading.
        self.clock = CheckpointClock(self.run.spec.checkpoints.every_minutes)
        resume = self.position.resume_from
        self.saved_at = resume.step if resume is not None and not resume.micro else None
        self.evaluated_at: int | None = None
        self.evaluating = False

    def train(self) -> Finished:
        """Every step to the end, then the last evaluation and what the run measured."""
        run, position, live = self.run, self.position, self.live
        try:
            # The base before the first step, and before the stop is armed: a SIGTERM during it
            # ends the run at once, with nothing to save.
            if live.evaluation is not None:
                self._evaluating(live.evaluation.before, position.step)
            live.progress.begin(position.step, tokens=position.tokens, trained=position.trained_tokens)
            run.stop.arm()
            while position.step < self.loaded.schedule.total_steps:
                faults.current().out_of_memory_at(position.step + 1, tightened=self.setup.decided.retry is not None)
                outcome = live.loop.step(position.step, resume=position.partial, stop=lambda: run.stop.requested)
                position.partial = None
                if isinstance(outcome, Partial):
                    raise self._stopped(self.save_checkpoint(position.step, outcome), outcome)
                self._after_step(outcome)
            # Every rank decides alike (the evaluation is collective): only rank 0 keeps `progress`.
            if self.loaded.eval_rows and self.evaluated_at != position.step:
                self.evaluate()
            # The tuned model once the last checkpoint is written: a stop during it loses no step.
            if live.evaluation is not None and not self._evaluating(live.evaluation.after, position.step):
                raise self._stopped(checkpoint_name(position.step), None)
            finished = self._finished()
            topology.barrier(run.ranks)
        except torch.OutOfMemoryError as exc:
            live.cleanup(failed=True)
            raise self._out_of_memory(exc) from None
        except BaseException:
            # The run ends here (Interrupted, NonFiniteLoss...): send the last status and stop the
            # reporter's thread now. Left running into the interpreter's teardown, mid-request, it
            # ended a pod with SIGABRT instead of the exit code its Job's failure policy reads.
            live.cleanup(failed=True)
            raise
        return finished

    def _finished(self) -> Finished:
        """Whether the ranks hold one adapter, the GPUs' and the hosts' peaks (collectives)."""
        run, setup = self.run, self.setup
        in_step = all_equal(self.loaded.adapter.params)
        peaks = setup.mode.peaks(setup.hardware, run.ranks, setup.device, setup.probe)
        return Finished(in_step, peaks, _host_peaks(run.ranks, setup.device, run.memory, setup.mode.bytes_read))

    def _after_step(self, figures: StepFigures) -> None:
        """Count a finished step, report it, and checkpoint, evaluate or stop where due."""
        run, position, live = self.run, self.position, self.live
        training, total = run.spec.training, self.loaded.schedule.total_steps
        position.step += 1
        step = position.step
        position.tokens += figures.tokens
        position.trained_tokens += figures.trained
        if run.main:
            report = step % training.logging_steps == 0 or step in {1, total}
            live.progress.step(
                step,
                loss=figures.loss,
                lr=figures.lr,
                tokens=figures.tokens,
                trained=figures.trained,
                epoch=self.loaded.schedule.epoch_of(step),
                report=report,
                metrics=run.objective.step_metrics(figures.loss, figures.trained, figures.sums),
            )
            if report:
                run.objective.write_samples(step, run.output)
        faults.current().after_step(step)
        by_steps = step % run.spec.checkpoints.every_steps == 0 or step == total
        stopping, by_clock = live.loop.agree(run.stop.requested, self.clock.due())
        if by_steps and not stopping:
            self.evaluate()
        if by_steps or by_clock or (stopping and self.saved_at != step):
            self.save_checkpoint(step)
            self.saved_at = step
            if not stopping:  # a SIGTERM during the write: this checkpoint is the point reached
                (stopping,) = live.loop.agree(run.stop.requested)
        if stopping:
            raise self._stopped(checkpoint_name(step), None)
        # The tuned model at a checkpoint (evaluation.atCheckpoints), after it is written: a stop
        # during it loses nothing; the last step's is the evaluation after training.
        evaluation = live.evaluation if run.spec.evaluation.at_checkpoints and by_steps and step < total else None
        if evaluation is not None and not self._evaluating(evaluation.at_checkpoint, step):
            raise self._stopped(checkpoint_name(step), None)

    def _evaluating(self, stage: Callable[..., bool | None], *args: int) -> bool:
        """A stage of the base-against-tuned evaluation (collective); an OOM in it says so."""
        self.evaluating = True
        try:
            return stage(*args) is not False
        finally:
            self.evaluating = False

    def save_checkpoint(self, at: int, partial: Partial | None = None) -> str:
        """Rank 0 writes, every rank waits for it; returns the checkpoint's name."""
        name = checkpoint_name(at, partial.micro_done if partial else 0)
        if self.run.main:
            write_checkpoint(self.state, at, partial)
        topology.barrier(self.run.ranks)
        self.clock.reset()
        return name

    def evaluate(self) -> None:
        """The held-out loss now (collective: every rank calls it); rank 0 reports it."""
        self.evaluated_at = self.position.step
        self.evaluating = True
        eval_loss = self.live.loop.evaluate()
        self.evaluating = False
        if self.run.main and eval_loss is not None:
            self.live.progress.evaluated(self.position.step, eval_loss)

    def _stopped(self, name: str, partial: Partial | None) -> TrainerFailure:
        run, step = self.run, self.position.step
        seconds = run.stop.seconds_since() if run.main else None
        done = partial.micro_done if partial else 0
        if run.main:
            emit(
                "stopped",
                checkpoint=name,
                step=step,
                microBatchesDone=done,
                secondsAfterSignal=round(seconds or 0, 3),
            )
        return interrupted(name, step, done, run.spec.training.gradient_accumulation, seconds)

    def _out_of_memory(self, exc: torch.OutOfMemoryError) -> TrainerFailure:
        """OutOfMemory with where it happened and the peak this rank measured, against its GPU's
        figure in the plan (the pod's command settles the retry: `oom_retry.settle`)."""
        step, setup = self.position.step, self.setup
        where = f"in the evaluation at step {step}" if self.evaluating else f"at step {step + 1}"
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        plan = setup.launch.plan
        if not setup.hardware.on_gpu or plan is None:
            anon = self.run.memory.anon_peak_gib
            return TrainerFailure(ExitReason.OutOfMemory, at_step(where, anon, None, "", detail))
        probe, device = setup.probe, setup.device
        peak = (probe.peak_bytes() if probe.enabled else torch.cuda.max_memory_allocated(device)) / GIB
        planned = plan.per_gpu[min(device.index or 0, len(plan.per_gpu) - 1)].total / GIB
        return TrainerFailure(ExitReason.OutOfMemory, at_step(where, peak, planned, str(device), detail))


def _host_peaks(ranks: Topology, device: torch.device, memory: HostMemory, bytes_read: int) -> HostPeaks:
    """Peak host memory (GiB) of every rank, resident and anonymous, and the model bytes all the
    ranks read from the model volume, gathered to every rank."""
    n = ranks.world_size
    resident, anon, pinned = [0.0] * n, [0.0] * n, [0.0] * n
    resident[ranks.rank] = memory.resident_peak_gib()
    anon[ranks.rank] = memory.anon_peak_gib
    pinned[ranks.rank] = memory.pinned_peak_gib()
    every = sum_figures([*resident, *anon, *pinned, float(bytes_read)], n, device)
    return HostPeaks(
        resident=[round(v, 2) for v in every[:n]],
        anonymous=[round(v, 2) for v in every[n : 2 * n]],
        pinned=[round(v, 2) for v in every[2 * n : 3 * n]],
        bytes_read=int(every[-1]),
    )

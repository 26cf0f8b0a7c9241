"""One training run in one process of the job, as a recipe of named stages.

`Recipe.run` goes setup -> resume -> train (checkpoint and evaluate along the way) -> export
-> summary, then cleanup; the state the stages share lives on the recipe (the anchor is
torchtune's recipe interface: `setup`, `train`, `save_checkpoint`, `cleanup`).

The order is the point: everything that can fail cheaply (config, hardware, data, memory plan)
fails before a single weight is loaded, and nothing is trained before the precision guard has
passed. Every rank runs the checks; rank 0 alone (global rank 0, in the pod of index 0 of a job
of several nodes) writes checkpoints, progress, status, TensorBoard, the adapter and the summary.

The batch: every optimizer step sees

    effective batch = batchSize x gradientAccumulation x processes x nodes

samples (`processes` per pod, as the plan launched them; `nodes` pods): each rank runs
gradientAccumulation micro-batches of batchSize samples, and the mode's reduction sums the
adapter's gradients over every rank of every node (`data.batches.Schedule` numbers them).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from finetune_api.reasons import ExitReason
from finetune_api.trainer_config import TrainerConfig
from finetune_plan.memory import GIB

from . import existing, families, fingerprint, objectives, test_hooks
from .checkpoints import Checkpoint, CheckpointStore, checkpoint_name
from .data.batches import Row, Schedule
from .data.checks import DataReport
from .data.loading import check_dataset, split
from .distributed import topology
from .distributed.gradsync import all_equal, sum_figures
from .distributed.resume import resume_point
from .distributed.topology import Topology
from .failures import TrainerFailure
from .hardware import (
    apply_memory_cap,
    choose_attention,
    configure_cpu_threads,
    detect,
    disable_compiler_if_unsupported,
    disable_triton_kernels,
    resolve_precision,
)
from .host_memory import HostMemory
from .launch_plan import Decision, decide, head_dim
from .loop import Loop, StepFigures
from .loss_head import install as install_loss_head
from .memory_phases import PhaseProbe
from .model_loading import DTYPES, load_model, load_model_config, load_tokenizer
from .modes import for_run
from .oom_retry import at_step
from .optim import make_optimizer, make_scheduler
from .output_checks import check_formats
from .precision_guard import GuardReport, fail_if_half, recast_to_fp32, scan_tensors
from .preflight import memory_plan
from .progress import Counting, Progress, emit
from .recipe_outputs import Outputs, checkpoint_ref
from .self_check import check_gpu_stack
from .status_patch import StatusReporter
from .stopping import CheckpointClock, StopRequest, interrupted
from .train_state import Adapter, Partial
from .train_state import load as load_state

log = logging.getLogger(__name__)


def _plant_half(model: nn.Module, kind: str) -> None:
    """Test hook: put one bf16 tensor where the guard must find it."""
    if kind == "parameter":
        param = next(p for p in model.named_parameters() if p[1].requires_grad)[1]
        param.data = param.data.to(torch.bfloat16)
    elif kind == "buffer":
        target = next(m for n, m in model.named_modules() if n.endswith("input_layernorm"))
        target.register_buffer("planted", torch.zeros(2, dtype=torch.bfloat16))
    elif kind == "activation":
        target = next(m for n, m in model.named_modules() if n.endswith("self_attn.o_proj"))
        target.register_forward_hook(lambda _m, _i, out: out.to(torch.bfloat16))


def _host_peaks(ranks: Topology, device: torch.device, memory: HostMemory, bytes_read: int) -> dict[str, Any]:
    """Peak host memory (GiB) of every rank, resident and anonymous, and the model bytes all the
    ranks read from the model volume, gathered to every rank."""
    n = ranks.world_size
    resident, anon, pinned = [0.0] * n, [0.0] * n, [0.0] * n
    resident[ranks.rank] = memory.resident_peak_gib()
    anon[ranks.rank] = memory.anon_peak_gib
    pinned[ranks.rank] = memory.pinned_peak_gib()
    every = sum_figures([*resident, *anon, *pinned, float(bytes_read)], n, device)
    return {
        "resident": [round(v, 2) for v in every[:n]],
        "anonymous": [round(v, 2) for v in every[n : 2 * n]],
        "pinned": [round(v, 2) for v in every[2 * n : 3 * n]],
        "bytesRead": int(every[-1]),
    }


def _guard(model: nn.Module, precision: str) -> GuardReport | None:
    if precision != "fp32":
        return None
    report = GuardReport()
    report.recast = recast_to_fp32(model)
    planted = test_hooks.plant_half()
    if planted:
        _plant_half(model, planted)
    scan_tensors(model, report)
    fail_if_half(report)
    return report


class Recipe(Outputs):
    """This process's run; its stages share their state as attributes."""

    def __init__(
        self,
        config: TrainerConfig,
        ranks: Topology = topology.SINGLE,
        stop: StopRequest | None = None,
        decision: Decision | None = None,
    ) -> None:
        self.started = time.time()
        self.memory = HostMemory().start()
        # The spec as asked: the checkpoints' fingerprint, the same before and after an OOM retry.
        self.asked = config
        self.fingerprint: dict[str, Any] = {}
        # The retry after an OOM trains its tighter micro-batch, accumulation and checkpointing.
        self.config = config = decision.applied(config) if decision is not None else config
        self.spec = config.spec
        # What training minimises and reads (training.method): its rows, batches, loss and figures.
        self.objective = objectives.for_spec(self.spec)
        self.ranks = ranks
        self.main = ranks.is_main
        self.stop = stop or StopRequest()
        self.decision = decision
        self.output = Path(config.paths.output)
        self.step = 0
        self.tokens = 0
        self.trained_tokens = 0  # targets of the loss, beside all tokens processed
        self.partial: Partial | None = None
        self.resume_from: Checkpoint | None = None
        self.evaluated_at: int | None = None
        self.evaluating = False
        self.reporter: StatusReporter | None = None

    def run(self) -> dict[str, Any] | None:
        """Every stage in order; the summary on rank 0, None on the others."""
        self.setup()
        self.resume()
        try:
            self.train()
        finally:
            self.progress.close()
            self.memory.stop()
        if not self.in_step:
            log.error("the adapter differs between ranks after training")
        # The process group is left for the process's end to free (a worker ends in os._exit,
        # see entry.main): gloo's destructor joins its worker thread holding the GIL, while that
        # thread may need the GIL to free the last collective's tensors, and the rank then hangs.
        # Under fsdp every rank answers the samples with rank 0, in lockstep (samples.py).
        rows = self._sample_rows() if self.mode.sharded else None
        if not self.main:
            return None
        self.export(rows)
        return self.summary()

    # --- setup ---------------------------------------------------------------------------------
    def setup(self) -> None:
        """Checks, the launch, the model in its mode, the data, the optimizer and the store."""
        self._check_and_decide()
        self._load()
        self._prepare_training()

    def _check_and_decide(self) -> None:
        """Hardware, data and the launch decision, before any weight loads."""
        spec, ranks = self.spec, self.ranks
        if self.main:
            self.output.mkdir(parents=True, exist_ok=True)
        self.hardware = hardware = detect(spec)
        threads = configure_cpu_threads(spec, ranks.local_world_size)
        self.facts = check_gpu_stack() if hardware.on_gpu and self.main else {}
        compiler_off = disable_compiler_if_unsupported(hardware)
        triton_off = disable_triton_kernels() if compiler_off else False
        self.precision = precision = resolve_precision(spec.precision, hardware)
        model_config = load_model_config(self.config)
        self.family = families.check(model_config, spec)  # a model it cannot train: InvalidConfig, one line
        if self.main:  # e.g. GGUF's tools and tokenizer: one line now, not after training (rank 0 exports)
            check_formats(self.config)
        self.tokenizer = load_tokenizer(self.config)
        self.data: DataReport = check_dataset(self.config, self.tokenizer, model_config)
        if self.main:
            self._existing_checkpoints()
        decision = self.decision
        if decision is None:  # no launcher handed one down: decide here, as it would have
            attention = families.kernel(
                self.family, choose_attention(hardware, head_dim(model_config), DTYPES[precision])
            )
            decision = Decision(decide(self.config, hardware, model_config, attention), attention)
        self.decided = decision
        self.attention = decision.attention
        self.launch = launch = decision.launch
        self.mode = for_run(launch.parallelism, ranks.world_size)
        self.mode.check_world(launch, ranks.local_world_size)
        self.plan = memory_plan(launch, hardware)
        self.objective.split = self.plan.splits_pairs and bool(self.objective.entry.sequence_names)
        if self.objective.split:
            log.info(
                "pairs: %s one forward each (the plan's pair split)", " and ".join(self.objective.entry.sequence_names)
            )
        self.device = ranks.device(hardware.on_gpu)
        self.probe = PhaseProbe(self.mode.loop_device(self.device))
        if hardware.on_gpu:
            apply_memory_cap(hardware, self.mode.memory_cap_device(self.device))
        log.info(
            "rank %d of %d: %s on %s, %d CPU threads; precision %s; torch.compile %s; Triton kernels %s",
            ranks.rank,
            ranks.world_size,
            launch.parallelism,
            hardware.describe(),
            threads,
            precision,
            "off" if compiler_off else "allowed",
            "off" if triton_off else "allowed",
        )
        topology.start(ranks, hardware.on_gpu)

    def _existing_checkpoints(self) -> None:
        """`spec.output.onExisting` against the checkpoints already there, before any weight loads:
        a mismatch fails here, at once (existing.decide); `fresh` moves the old run aside."""
        self.fingerprint = fingerprint.fingerprint(self.asked, self.ranks.world_size)
        store = CheckpointStore(self.output / "checkpoints", self.spec.checkpoints.keep)
        found = existing.found(store.complete())
        action = existing.decide(self.spec.output.on_existing, found, self.fingerprint, self.config.job_uid)
        if action == "moveAside":
            moved = existing.move_aside(self.output)
            log.info(
                "spec.output.onExisting is fresh: the earlier run's %d checkpoint(s) and outputs moved to %s;"
                " training starts at step 0",
                len(found),
                moved,
            )
            emit("outputMovedAside", path=str(moved), checkpoints=[f.checkpoint.name for f in found])

    def _load(self) -> None:
        """The model as the mode loads and wraps it, the rows and the schedule, the guard."""
        training, ranks = self.spec.training, self.ranks
        model = load_model(
            self.config,
            self.hardware,
            self.precision,
            self.attention,
            self.plan,
            mode=self.mode,
            device=self.device,
            seed=training.seed,
        )
        self.adapter = Adapter.of(model)
        self.lora = families.adapted(model)
        log.info("LoRA on %s: %d LoRA layers", ", ".join(self.lora["modules"]), self.lora["layers"])
        self.head = install_loss_head(model, self.decided.loss_chunk_tokens)
        self.train_samples, self.eval_samples = split(self.data.samples, self.spec.dataset.eval_fraction, training.seed)
        self.rows: list[Row] = self.objective.rows(self.train_samples, self.tokenizer, self.spec)
        self.eval_rows = (
            self.objective.rows(self.eval_samples, self.tokenizer, self.spec) if self.eval_samples else None
        )
        self.schedule = Schedule.make(
            rows=len(self.rows),
            batch_size=training.batch_size,
            accumulation=training.gradient_accumulation,
            world=ranks.world_size,
            seed=training.seed,
            max_steps=training.max_steps,
            epochs=training.epochs,
        )
        self.guard = _guard(model, self.precision)
        self.trained = self.mode.wrap(model, self.adapter.params, ranks, self.hardware.on_gpu)
        self.loaded_s = time.time() - self.started  # start-up, data checks, loading and wrapping
        self.trained.train()  # gradient checkpointing only acts in training mode

    def _prepare_training(self) -> None:
        """Optimizer, scheduler and the checkpoint store (its incomplete checkpoints removed)."""
        training = self.spec.training
        self.optimizer = make_optimizer(training, self.adapter.params)
        self.scheduler = make_scheduler(training, self.optimizer, self.schedule.total_steps)
        self.store = CheckpointStore(self.output / "checkpoints", self.spec.checkpoints.keep)
        if self.main:
            for removed in self.store.clean_incomplete():
                log.warning("removed incomplete checkpoint %s", removed)
                emit("checkpointDiscarded", name=removed)
        topology.barrier(self.ranks)

    # --- resume --------------------------------------------------------------------------------
    def resume(self) -> None:
        """Restore the latest checkpoint, if any; then the loop, the reporter and `start`."""
        ranks, training = self.ranks, self.spec.training
        saved: dict[str, Any] = {}
        # Ranks in other pods restore from rank 0's copy: they may not see this volume.
        with resume_point(self.store, ranks) as resume:
            if resume is not None:
                self.step, self.tokens, saved, self.partial = load_state(
                    resume.path, self.adapter, self.optimizer, self.scheduler
                )
        self.resume_from = resume
        self.trained_tokens = int(saved.get("trainedTokens", 0))
        if resume is not None:
            log.info(
                "resuming from %s (%s), written by %s process(es) in %s",
                resume.name,
                resume.path,
                saved.get("worldSize"),
                saved.get("parallelism"),
            )
            partial = self.partial
            if partial is not None and not partial.fits(ranks.world_size, training.gradient_accumulation):
                log.warning(
                    "%s stopped inside step %d on %d process(es) with accumulation %d; on %d with %d its"
                    " micro-batches are numbered otherwise, so step %d runs again from its start",
                    resume.name,
                    partial.step + 1,
                    partial.world_size,
                    partial.accumulation,
                    ranks.world_size,
                    training.gradient_accumulation,
                    partial.step + 1,
                )
                self.partial = None
        self._start_loop()

    def _start_loop(self) -> None:
        """The reporter, the progress, the loop in the mode, and the `start` event."""
        main, training = self.main, self.spec.training
        self.reporter = StatusReporter.from_environment(self.config.job_name, self.config.namespace) if main else None
        objective = self.objective
        counting = Counting(objective.trained_name, objective.metric_tags, objective.metrics_text)
        self.progress = Progress(
            self.reporter, self.output / "tensorboard" if main else None, self.schedule.total_steps, counting
        )
        self.progress.lora = self.lora
        self.loop = Loop(
            model=self.trained,
            head=self.head,
            adapter=self.adapter,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            objective=self.objective,
            schedule=self.schedule,
            rows=self.rows,
            eval_rows=self.eval_rows,
            topology=self.ranks,
            device=self.mode.loop_device(self.device),
            pad_id=int(self.tokenizer.pad_token_id),
            packed=training.packing,
            seed=training.seed,
            max_grad_norm=training.max_grad_norm,
            eval_batch_size=self.decided.savers(self.config).eval_batch_size,
            mode=self.mode,
            guard=self.guard,
            probe=self.probe if self.probe.enabled else None,
        )
        self.loop.last_checkpoint = self._kept
        if self.reporter is not None and self.resume_from is not None:
            # What exists from the start of this attempt on, not only once it writes its own.
            resumed = self.resume_from
            self.reporter.checkpoint(resumed.step, str(resumed.path), resumed.time)
        if main:
            emit(
                "start",
                job=self.config.job_name,
                hardware=self.hardware.describe(),
                precision=self.precision,
                attention=self.attention,
                family=self.family.label,
                lora=self.lora,
                parallelism=self.launch.parallelism,
                worldSize=self.ranks.world_size,
                memoryPlan=self.plan.source,
                resumeFrom=checkpoint_ref(self.resume_from) if self.resume_from else None,
                samples=len(self.train_samples),
                rows=len(self.rows),
                evalSamples=len(self.eval_samples) if self.eval_samples else 0,
            )

    def _kept(self) -> str:
        last = self.store.latest()
        return f"last good checkpoint: step {last.step} ({last.path})" if last else "no checkpoint written yet"

    # --- train ---------------------------------------------------------------------------------
    def train(self) -> None:
        """The optimizer steps to the end, checkpointing and evaluating along the way; a stop
        request (SIGTERM) ends it with a checkpoint of the point reached."""
        resume = self.resume_from
        self.progress.begin(self.step, tokens=self.tokens, trained=self.trained_tokens)
        self.clock = CheckpointClock(self.spec.checkpoints.every_minutes)
        self.saved_at = resume.step if resume is not None and not resume.micro else None
        self.stop.arm()
        try:
            while self.step < self.schedule.total_steps:
                test_hooks.out_of_memory_at(self.step + 1, tightened=self.decided.retry is not None)
                outcome = self.loop.step(self.step, resume=self.partial, stop=lambda: self.stop.requested)
                self.partial = None
                if isinstance(outcome, Partial):
                    raise self._stopped(self.save_checkpoint(self.step, outcome), outcome)
                self._after_step(outcome)
            # Every rank decides alike (the evaluation is collective): only rank 0 keeps `progress`.
            if self.eval_rows and self.evaluated_at != self.step:
                self.evaluate()
            self.in_step = all_equal(self.adapter.params)
            self.peaks = self.mode.peaks(self.hardware, self.ranks, self.device, self.probe)
            self.host_peaks = _host_peaks(self.ranks, self.device, self.memory, self.mode.bytes_read)
            topology.barrier(self.ranks)
        except torch.OutOfMemoryError as exc:
            self.cleanup()
            raise self._out_of_memory(exc) from None
        except BaseException:
            # The run ends here (Interrupted, NonFiniteLoss...): send the last status and stop the
            # reporter's thread now. Left running into the interpreter's teardown, mid-request, it
            # ended a pod with SIGABRT instead of the exit code its Job's failure policy reads.
            self.cleanup()
            raise

    def _out_of_memory(self, exc: torch.OutOfMemoryError) -> TrainerFailure:
        """OutOfMemory with where it happened and the peak this rank measured, against its GPU's
        figure in the plan (the pod's command settles the retry: `oom_retry.settle`)."""
        where = f"in the evaluation at step {self.step}" if self.evaluating else f"at step {self.step + 1}"
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        plan = self.launch.plan
        if not self.hardware.on_gpu or plan is None:
            return TrainerFailure(ExitReason.OutOfMemory, at_step(where, self.memory.anon_peak_gib, None, "", detail))
        probe = self.probe
        peak = (probe.peak_bytes() if probe.enabled else torch.cuda.max_memory_allocated(self.device)) / GIB
        planned = plan.per_gpu[min(self.device.index or 0, len(plan.per_gpu) - 1)].total / GIB
        return TrainerFailure(ExitReason.OutOfMemory, at_step(where, peak, planned, str(self.device), detail))

    def _after_step(self, figures: StepFigures) -> None:
        """Count a finished step, report it, and checkpoint, evaluate or stop where due."""
        training, total = self.spec.training, self.schedule.total_steps
        self.step += 1
        step = self.step
        self.tokens += figures.tokens
        self.trained_tokens += figures.trained
        if self.main:
            report = step % training.logging_steps == 0 or step in {1, total}
            self.progress.step(
                step,
                loss=figures.loss,
                lr=figures.lr,
                tokens=figures.tokens,
                trained=figures.trained,
                epoch=self.schedule.epoch_of(step),
                report=report,
                metrics=self.objective.step_metrics(figures.loss, figures.trained, figures.sums),
            )
        test_hooks.die_after_step(step)
        delay = test_hooks.step_delay()
        if delay:
            time.sleep(delay)
        by_steps = step % self.spec.checkpoints.every_steps == 0 or step == total
        stopping, by_clock = self.loop.agree(self.stop.requested, self.clock.due())
        if by_steps and not stopping:
            self.evaluate()
        if by_steps or by_clock or (stopping and self.saved_at != step):
            self.save_checkpoint(step)
            self.saved_at = step
            if not stopping:  # a SIGTERM during the write: this checkpoint is the point reached
                (stopping,) = self.loop.agree(self.stop.requested)
        if stopping:
            raise self._stopped(checkpoint_name(step), None)

    def _stopped(self, name: str, partial: Partial | None) -> TrainerFailure:
        seconds = self.stop.seconds_since() if self.main else None
        done = partial.micro_done if partial else 0
        if self.main:
            emit(
                "stopped",
                checkpoint=name,
                step=self.step,
                microBatchesDone=done,
                secondsAfterSignal=round(seconds or 0, 3),
            )
        return interrupted(name, self.step, done, self.spec.training.gradient_accumulation, seconds)

    # --- evaluate ------------------------------------------------------------------------------
    def evaluate(self) -> None:
        """The held-out loss now (collective: every rank calls it); rank 0 reports it."""
        self.evaluated_at = self.step
        self.evaluating = True
        eval_loss = self.loop.evaluate()
        self.evaluating = False
        if self.main and eval_loss is not None:
            self.progress.evaluated(self.step, eval_loss)

    # --- cleanup -------------------------------------------------------------------------------
    def cleanup(self) -> None:
        """Stop the status reporter's thread (its last status sent)."""
        if self.reporter is not None:
            self.reporter.close()


def train(
    config: TrainerConfig,
    ranks: Topology = topology.SINGLE,
    stop: StopRequest | None = None,
    decision: Decision | None = None,
) -> dict[str, Any] | None:
    """Train this process's part; returns the summary on rank 0, None on the others. With a
    `stop` request installed, SIGTERM ends the run with a checkpoint of the point reached."""
    return Recipe(config, ranks, stop, decision).run()

"""One training run in one process of the job, start to finish: checks, load, guard, train, export.

The order is the point: everything that can fail cheaply (config, hardware, data, memory plan)
fails before a single weight is loaded, and nothing is trained before the precision guard has
passed. Every rank runs the checks; rank 0 alone (global rank 0, in the pod of index 0 of a job
of several nodes) writes checkpoints, progress, status, TensorBoard, the adapter and the summary.
"""

import logging
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from finetune_api.trainer_config import TrainerConfig

from . import families, test_hooks
from .checkpoints import Checkpoint, CheckpointStore, checkpoint_name
from .data.batches import Row, Schedule, make_rows
from .data.loading import check_dataset, split
from .distributed import fsdp, topology
from .distributed.gradsync import all_equal, sum_figures
from .distributed.resume import resume_point
from .distributed.topology import Topology
from .export import save_adapter, save_merged, write_summary
from .failures import TrainerFailure
from .hardware import (
    Hardware,
    apply_memory_cap,
    choose_attention,
    configure_cpu_threads,
    detect,
    disable_compiler_if_unsupported,
    disable_triton_kernels,
    resolve_precision,
)
from .host_memory import HostMemory
from .launch_plan import check_world, decide, loss_chunk_tokens
from .loop import Loop
from .loss_head import install as install_loss_head
from .model_loading import DTYPES, load_model, load_model_config, load_tokenizer
from .optim import make_optimizer, make_scheduler
from .precision_guard import GuardReport, fail_if_half, recast_to_fp32, scan_tensors
from .preflight import MemoryPlan, memory_plan
from .progress import Progress, emit
from .self_check import check_gpu_stack
from .status_patch import StatusReporter
from .stopping import CheckpointClock, StopRequest, interrupted
from .train_state import Adapter, Partial
from .train_state import Progress as SavedProgress
from .train_state import load as load_state
from .train_state import save as save_state

log = logging.getLogger(__name__)


def _head_dim(model_config: Any) -> int:
    explicit = getattr(model_config, "head_dim", None)
    if explicit:
        return int(explicit)
    return int(model_config.hidden_size // model_config.num_attention_heads)


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


def checkpoint_ref(checkpoint: Checkpoint) -> dict[str, Any]:
    ref: dict[str, Any] = {"step": checkpoint.step, "path": str(checkpoint.path), "time": checkpoint.time}
    if checkpoint.micro:
        ref["microBatchesDone"] = checkpoint.micro
    return ref


def _peaks(hardware: Hardware, ranks: Topology, device: torch.device, parallelism: str) -> list[float]:
    """Peak GiB allocated on every GPU of the pod, gathered to every rank."""
    if not hardware.on_gpu:
        return []
    if parallelism == "deviceMap":
        return [round(torch.cuda.max_memory_allocated(g.index) / 2**30, 2) for g in hardware.gpus]
    mine = [0.0] * ranks.world_size
    mine[ranks.rank] = torch.cuda.max_memory_allocated(device) / 2**30
    return [round(v, 2) for v in sum_figures(mine, ranks.world_size, device)]


def _host_peaks(ranks: Topology, device: torch.device, memory: HostMemory) -> dict[str, list[float]]:
    """Peak host memory (GiB) of every rank, resident and anonymous, gathered to every rank."""
    resident = [0.0] * ranks.world_size
    anon = [0.0] * ranks.world_size
    resident[ranks.rank] = memory.resident_peak_gib()
    anon[ranks.rank] = memory.anon_peak_gib
    both = sum_figures(resident + anon, ranks.world_size, device)
    return {
        "resident": [round(v, 2) for v in both[: ranks.world_size]],
        "anonymous": [round(v, 2) for v in both[ranks.world_size :]],
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


def train(
    config: TrainerConfig, ranks: Topology = topology.SINGLE, stop: StopRequest | None = None
) -> dict[str, Any] | None:
    """Train this process's part; returns the summary on rank 0, None on the others. With a
    `stop` request installed, SIGTERM ends the run with a checkpoint of the point reached."""
    started = time.time()
    memory = HostMemory().start()
    stop = stop or StopRequest()
    spec = config.spec
    main = ranks.is_main
    output = Path(config.paths.output)
    if main:
        output.mkdir(parents=True, exist_ok=True)

    hardware = detect(spec)
    threads = configure_cpu_threads(spec, ranks.local_world_size)
    facts = check_gpu_stack() if hardware.on_gpu and main else {}
    compiler_off = disable_compiler_if_unsupported(hardware)
    triton_off = disable_triton_kernels() if compiler_off else False
    precision = resolve_precision(spec.precision, hardware)
    model_config = load_model_config(config)
    family = families.check(model_config, spec)  # a model it cannot train: InvalidConfig, one line
    tokenizer = load_tokenizer(config)
    data = check_dataset(config, tokenizer, model_config)
    attention = families.kernel(family, choose_attention(hardware, _head_dim(model_config), DTYPES[precision]))
    launch = decide(config, hardware, model_config, attention)
    check_world(launch, ranks.local_world_size)
    plan: MemoryPlan = memory_plan(launch, hardware)
    on_gpu = hardware.on_gpu
    device = ranks.device(on_gpu)
    if on_gpu:
        apply_memory_cap(hardware, None if launch.parallelism == "deviceMap" else device.index)
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
    topology.start(ranks, on_gpu)
    # FSDP over one process shards nothing (it would run NO_SHARD): one process trains as the
    # world-size-1 case of dataParallel, whatever the mode is called.
    sharded = launch.parallelism == "fsdp" and ranks.world_size > 1
    loading = launch.parallelism if launch.parallelism != "fsdp" or sharded else "dataParallel"

    training = spec.training
    model = load_model(
        config, hardware, precision, attention, plan, parallelism=loading, device=device, seed=training.seed
    )
    adapter = Adapter.of(model)
    lora = families.adapted(model)
    log.info("LoRA on %s: %d LoRA layers", ", ".join(lora["modules"]), lora["layers"])
    head = install_loss_head(model, loss_chunk_tokens(launch))
    train_samples, eval_samples = split(data.samples, spec.dataset.eval_fraction, training.seed)
    rows: list[Row] = make_rows(train_samples, tokenizer, training.max_length, training.packing)
    eval_rows = make_rows(eval_samples, tokenizer, training.max_length, training.packing) if eval_samples else None
    schedule = Schedule.make(
        rows=len(rows),
        batch_size=training.batch_size,
        accumulation=training.gradient_accumulation,
        world=ranks.world_size,
        seed=training.seed,
        max_steps=training.max_steps,
        epochs=training.epochs,
    )
    guard = _guard(model, precision)
    trained: nn.Module = model
    if sharded:
        trained = fsdp.shard(model, adapter.params, ranks, on_gpu)
    loaded_s = time.time() - started  # start-up, data checks, loading and sharding
    trained.train()  # gradient checkpointing only acts in training mode

    optimizer = make_optimizer(training, adapter.params)
    scheduler = make_scheduler(training, optimizer, schedule.total_steps)
    store = CheckpointStore(output / "checkpoints", spec.checkpoints.keep)
    if main:
        for removed in store.clean_incomplete():
            log.warning("removed incomplete checkpoint %s", removed)
            emit("checkpointDiscarded", name=removed)
    topology.barrier(ranks)
    step, tokens_before = 0, 0
    partial: Partial | None = None
    saved: dict[str, Any] = {}
    # Ranks in other pods restore from rank 0's copy: they may not see this volume.
    with resume_point(store, ranks) as resume:
        if resume is not None:
            step, tokens_before, saved, partial = load_state(resume.path, adapter, optimizer, scheduler)
    if resume is not None:
        log.info(
            "resuming from %s (%s), written by %s process(es) in %s",
            resume.name,
            resume.path,
            saved.get("worldSize"),
            saved.get("parallelism"),
        )
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
            partial = None

    reporter = StatusReporter.from_environment(config.job_name, config.namespace) if main else None
    progress = Progress(reporter, output / "tensorboard" if main else None, schedule.total_steps)
    progress.lora = lora
    loop = Loop(
        model=trained,
        head=head,
        adapter=adapter,
        optimizer=optimizer,
        scheduler=scheduler,
        schedule=schedule,
        rows=rows,
        eval_rows=eval_rows,
        topology=ranks,
        device=device if launch.parallelism != "deviceMap" else torch.device("cpu"),
        pad_id=int(tokenizer.pad_token_id),
        packed=training.packing,
        seed=training.seed,
        max_grad_norm=training.max_grad_norm,
        eval_batch_size=training.batch_size,
        sharded=sharded,
        guard=guard,
    )

    def kept() -> str:
        last = store.latest()
        return f"last good checkpoint: step {last.step} ({last.path})" if last else "no checkpoint written yet"

    loop.last_checkpoint = kept
    if main:
        emit(
            "start",
            job=config.job_name,
            hardware=hardware.describe(),
            precision=precision,
            attention=attention,
            family=family.label,
            lora=lora,
            parallelism=launch.parallelism,
            worldSize=ranks.world_size,
            memoryPlan=plan.source,
            resumeFrom=checkpoint_ref(resume) if resume else None,
            samples=len(train_samples),
            rows=len(rows),
            evalSamples=len(eval_samples) if eval_samples else 0,
        )
    every = spec.checkpoints.every_steps
    total = schedule.total_steps
    tokens = tokens_before
    progress.begin(step)
    evaluated_at: int | None = None
    clock = CheckpointClock(spec.checkpoints.every_minutes)
    saved_at = resume.step if resume is not None and not resume.micro else None

    def save(at: int, partial: Partial | None = None) -> str:
        """Rank 0 writes, every rank waits for it; returns the checkpoint's name."""
        name = checkpoint_name(at, partial.micro_done if partial else 0)
        if main:
            _checkpoint(
                store,
                at,
                adapter=adapter,
                optimizer=optimizer,
                scheduler=scheduler,
                tokens=tokens,
                ranks=ranks,
                parallelism=launch.parallelism,
                progress=progress,
                reporter=reporter,
                partial=partial,
            )
        topology.barrier(ranks)
        clock.reset()
        return name

    def stopped(name: str, partial: Partial | None) -> TrainerFailure:
        seconds = stop.seconds_since() if main else None
        done = partial.micro_done if partial else 0
        if main:
            emit(
                "stopped", checkpoint=name, step=step, microBatchesDone=done, secondsAfterSignal=round(seconds or 0, 3)
            )
        return interrupted(name, step, done, training.gradient_accumulation, seconds)

    stop.arm()
    try:
        while step < total:
            outcome = loop.step(step, resume=partial, stop=lambda: stop.requested)
            partial = None
            if isinstance(outcome, Partial):
                raise stopped(save(step, outcome), outcome)
            figures = outcome
            step += 1
            tokens += figures.tokens
            if main:
                report = step % training.logging_steps == 0 or step in {1, total}
                progress.step(
                    step,
                    loss=figures.loss,
                    lr=figures.lr,
                    tokens=figures.tokens,
                    epoch=schedule.epoch_of(step),
                    report=report,
                )
            test_hooks.die_after_step(step)
            delay = test_hooks.step_delay()
            if delay:
                time.sleep(delay)
            by_steps = step % every == 0 or step == total
            stopping, by_clock = loop.agree(stop.requested, clock.due())
            if by_steps and not stopping:
                evaluated_at = step
                eval_loss = loop.evaluate()
                if main and eval_loss is not None:
                    progress.evaluated(step, eval_loss)
            if by_steps or by_clock or (stopping and saved_at != step):
                save(step)
                saved_at = step
                if not stopping:  # a SIGTERM during the write: this checkpoint is the point reached
                    (stopping,) = loop.agree(stop.requested)
            if stopping:
                raise stopped(checkpoint_name(step), None)
        # Every rank decides alike (the evaluation is collective): only rank 0 keeps `progress`.
        if eval_rows and evaluated_at != step:
            eval_loss = loop.evaluate()
            if main and eval_loss is not None:
                progress.evaluated(step, eval_loss)
        in_step = all_equal(adapter.params)
        peaks = _peaks(hardware, ranks, device, launch.parallelism)
        host_peaks = _host_peaks(ranks, device, memory)
        topology.barrier(ranks)
    except BaseException:
        # The run ends here (Interrupted, NonFiniteLoss...): send the last status and stop the
        # reporter's thread now. Left running into the interpreter's teardown, mid-request, it
        # ended a pod with SIGABRT instead of the exit code its Job's failure policy reads.
        if reporter is not None:
            reporter.close()
        raise
    finally:
        progress.close()
        memory.stop()
    if not in_step:
        log.error("the adapter differs between ranks after training")
    # The process group is left for the process's end to free (a worker ends in os._exit, see
    # entry.main): gloo's destructor joins its worker thread holding the GIL, while that thread
    # may need the GIL to free the last collective's tensors, and the rank then hangs forever.
    if not main:
        return None

    try:
        adapter_path = save_adapter(adapter, tokenizer, output)
        merged = save_merged(config, adapter_path, tokenizer, output) if spec.output.merge else None
        if reporter is not None:
            reporter.progress(progress.status_progress())
    finally:
        if reporter is not None:
            reporter.close()

    latest = store.latest()
    summary = {
        "job": config.job_name,
        "finalStep": step,
        "totalSteps": total,
        "firstLoss": progress.first_loss,
        "finalLoss": progress.last.get("loss"),
        "evalLoss": progress.eval_loss,
        "tokensPerSecond": progress.last.get("tokensPerSecond"),
        "tokens": tokens,
        "adapterPath": str(adapter_path),
        "mergedPath": str(merged) if merged else None,
        "resumedFrom": checkpoint_ref(resume) if resume else None,
        "lastCheckpoint": checkpoint_ref(latest) if latest else None,
        "parallelism": launch.parallelism,
        "worldSize": ranks.world_size,
        "ranksInStep": in_step,
        "precision": precision,
        "attention": attention,
        "family": family.label,
        "lora": lora,
        "hardware": hardware.describe(),
        "gpuStack": facts,
        "memoryPlan": {"source": plan.source, **plan.summary},
        "precisionGuard": guard.summary() if guard is not None else None,
        "data": data.summary(),
        "lossSpikes": progress.spikes.spikes,
        "statusPatches": {"sent": reporter.sent, "failed": reporter.failed} if reporter else None,
        "peakGiBPerGpu": peaks,
        # Resident counts the model files' mapped pages (page cache, shared, droppable);
        # anonymous is what each process holds itself.
        "peakHostGiBPerProcess": host_peaks["resident"],
        "peakHostAnonGiBPerProcess": host_peaks["anonymous"],
        "loadSeconds": round(loaded_s, 1),
        "seconds": round(time.time() - started, 1),
    }
    write_summary(output, summary)
    emit("done", **{k: summary[k] for k in ("finalStep", "finalLoss", "evalLoss", "adapterPath", "precisionGuard")})
    return summary


def _checkpoint(
    store: CheckpointStore,
    step: int,
    *,
    adapter: Adapter,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    tokens: int,
    ranks: Topology,
    parallelism: str,
    progress: Progress,
    reporter: StatusReporter | None,
    partial: Partial | None = None,
) -> None:
    """Rank 0 writes the checkpoint atomically (staging, fsync, marker, rename)."""
    micro = partial.micro_done if partial else 0
    staging = store.begin(step, micro) / checkpoint_name(step, micro)
    progress_now = SavedProgress(step, tokens, ranks.world_size, parallelism)
    save_state(staging, adapter, optimizer, scheduler, progress_now, partial=partial)
    test_hooks.die_in_save(step)
    checkpoint = store.commit(step, micro)
    log.info("checkpoint %d complete: %s", step, checkpoint.path)
    emit("checkpoint", **checkpoint_ref(checkpoint))
    if reporter is not None:
        reporter.progress(progress.status_progress())
        reporter.checkpoint(checkpoint.step, str(checkpoint.path), checkpoint.time)

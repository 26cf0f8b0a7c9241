"""The setup stage: what can fail cheaply fails here, before a single weight loads (`decide`),
then the model loads in its mode with everything the steps need (`load`).

`decide`: the hardware and its precision, the model's family, the output formats' tools, the
tokenizer and the data, the checkpoints already in the output folder, the launch (handed down by
the pod's command, or decided here as it would have), the mode and its memory plan. `load`: the
model with LoRA, its loss head, the rows and their schedule, the precision guard, the wrapping,
the optimizer and the checkpoint store.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from torch import nn

from finetune_plan.families import Family

from .. import faults
from ..data.batches import Schedule
from ..data.loading import check_dataset, split
from ..distributed import topology
from ..hardware.capabilities import (
    Hardware,
    ResolvedPrecision,
    apply_memory_cap,
    configure_cpu_threads,
    detect,
    disable_compiler_if_unsupported,
    disable_triton_kernels,
    resolve_precision,
)
from ..hardware.self_check import check_gpu_stack
from ..memory.budget import MemoryPlan, memory_plan
from ..memory.phases import PhaseProbe
from ..model import families
from ..model.attention_choice import choose_attention
from ..model.loading import DTYPES, load_model, load_model_config, load_tokenizer
from ..model.loss_head import install as install_loss_head
from ..model.precision_guard import GuardReport, fail_if_half, recast_to_fp32, scan_tensors
from ..modes import for_run
from ..objectives import TrainingObjective
from ..outputs.checks import check_formats
from ..reporting.progress import emit
from ..state import existing, fingerprint
from ..state.checkpoints import CheckpointStore
from ..state.train_state import Adapter
from .launch_plan import Decision, head_dim
from .launch_plan import decide as decide_launch
from .optim import make_optimizer, make_scheduler
from .run_state import Loaded, Run, Setup

if TYPE_CHECKING:
    from transformers import PretrainedConfig

log = logging.getLogger(__name__)


def decide(run: Run) -> Setup:
    """Hardware, data and the launch decision, before any weight loads."""
    spec, ranks = run.spec, run.ranks
    if run.main:
        run.output.mkdir(parents=True, exist_ok=True)
    hardware = detect(spec)
    threads = configure_cpu_threads(spec, ranks.local_world_size)
    facts = check_gpu_stack() if hardware.on_gpu and run.main else {}
    compiler_off = disable_compiler_if_unsupported(hardware)
    triton_off = disable_triton_kernels() if compiler_off else False
    precision = resolve_precision(spec.precision, hardware)
    model_config = load_model_config(run.config)
    family = families.check(model_config, spec)  # a model it cannot train: InvalidConfig, one line
    if run.main:  # e.g. GGUF's tools and tokenizer: one line now, not after training (rank 0 exports)
        check_formats(run.config)
    tokenizer = load_tokenizer(run.config)
    data = check_dataset(run.config, tokenizer, model_config)
    # The held-out source (spec.dataset.eval), checked as the training data is.
    eval_data = check_dataset(run.config, tokenizer, model_config, held_out=True) if spec.dataset.eval else None
    recorded = _existing_checkpoints(run) if run.main else {}
    decided = run.decision
    if decided is None:  # no launcher handed one down: decide here, as it would have
        decided = _decide_here(run, hardware, model_config, family, precision)
    mode = for_run(decided.launch.parallelism, ranks.world_size)
    mode.check_world(decided.launch, ranks.local_world_size)
    plan = memory_plan(decided.launch, hardware)
    _split_pairs(run.objective, plan, run.spec.training.pair_split)
    device = ranks.device(hardware.on_gpu)
    probe = PhaseProbe(mode.loop_device(device))
    if hardware.on_gpu:
        apply_memory_cap(hardware, mode.memory_cap_device(device))
    log.info(
        "rank %d of %d: %s on %s, %d CPU threads; precision %s; torch.compile %s; Triton kernels %s",
        ranks.rank,
        ranks.world_size,
        decided.launch.parallelism,
        hardware.describe(),
        threads,
        precision,
        "off" if compiler_off else "allowed",
        "off" if triton_off else "allowed",
    )
    topology.start(ranks, hardware.on_gpu)
    return Setup(
        hardware=hardware,
        facts=facts,
        precision=precision,
        family=family,
        tokenizer=tokenizer,
        data=data,
        eval_data=eval_data,
        fingerprint=recorded,
        decided=decided,
        mode=mode,
        plan=plan,
        device=device,
        probe=probe,
    )


def _decide_here(
    run: Run, hardware: Hardware, model_config: PretrainedConfig, family: Family, precision: ResolvedPrecision
) -> Decision:
    """The launch decision the pod's command would have handed down, made in this process."""
    kernel = choose_attention(hardware, head_dim(model_config), DTYPES[precision])
    attention = families.kernel(family, kernel)
    return Decision(decide_launch(run.config, hardware, model_config, attention), attention)


def _split_pairs(objective: TrainingObjective, plan: MemoryPlan, asked: bool | str) -> None:
    """The plan's pair split (`asked`: training.pairSplit), for an objective whose rows are pairs
    of sequences."""
    objective.split = plan.splits_pairs(asked) and bool(objective.entry.sequence_names)
    if objective.split:
        log.info("pairs: %s one forward each (the plan's pair split)", " and ".join(objective.entry.sequence_names))


def _existing_checkpoints(run: Run) -> dict[str, Any]:
    """`spec.output.onExisting` against the checkpoints already there, before any weight loads:
    a mismatch fails here, at once (existing.decide); `fresh` moves the old run aside. Returns
    the fingerprint this run's checkpoints will carry."""
    recorded = fingerprint.fingerprint(run.asked, run.ranks.world_size)
    store = CheckpointStore(run.output / "checkpoints", run.spec.checkpoints.keep)
    found = existing.found(store.complete())
    action = existing.decide(run.spec.output.on_existing, found, recorded, run.config.job_uid)
    if action == "moveAside":
        moved = existing.move_aside(run.output)
        log.info(
            "spec.output.onExisting is fresh: the earlier run's %d checkpoint(s) and outputs moved to %s;"
            " training starts at step 0",
            len(found),
            moved,
        )
        emit("outputMovedAside", path=str(moved), checkpoints=[f.checkpoint.name for f in found])
    return recorded


def load(run: Run, setup: Setup) -> Loaded:
    """The model as the mode loads and wraps it, the rows and the schedule, the guard; then the
    optimizer, the scheduler and the checkpoint store (its incomplete checkpoints removed)."""
    training, ranks, objective = run.spec.training, run.ranks, run.objective
    model = load_model(
        run.config,
        setup.hardware,
        setup.precision,
        setup.attention,
        setup.plan,
        mode=setup.mode,
        device=setup.device,
        seed=training.seed,
    )
    adapter = Adapter.of(model)
    lora = families.adapted(model)
    log.info("LoRA on %s: %d LoRA layers", ", ".join(lora["modules"]), lora["layers"])
    head = install_loss_head(model, setup.decided.loss_chunk_tokens)
    held_out = setup.eval_data.samples if setup.eval_data is not None else None
    train_samples, eval_samples = split(setup.data.samples, run.spec.dataset.eval_fraction, training.seed, held_out)
    rows = objective.rows(train_samples, setup.tokenizer, run.spec)
    eval_rows = objective.rows(eval_samples, setup.tokenizer, run.spec) if eval_samples else None
    schedule = Schedule.make(
        rows=len(rows),
        batch_size=training.batch_size,
        accumulation=training.gradient_accumulation,
        world=ranks.world_size,
        seed=training.seed,
        max_steps=training.max_steps,
        epochs=training.epochs,
        repeats=objective.repeats,
    )
    guard = _guard(model, setup.precision)
    trained = setup.mode.wrap(model, adapter.params, ranks, setup.hardware.on_gpu)
    loaded_s = time.time() - run.started
    trained.train()  # gradient checkpointing only acts in training mode
    optimizer = make_optimizer(training, adapter.params)
    scheduler = make_scheduler(training, optimizer, schedule.total_steps)
    store = _store(run)
    return Loaded(
        adapter=adapter,
        lora=lora,
        head=head,
        train_samples=train_samples,
        eval_samples=eval_samples,
        rows=rows,
        eval_rows=eval_rows,
        schedule=schedule,
        guard=guard,
        trained=trained,
        loaded_s=loaded_s,
        optimizer=optimizer,
        scheduler=scheduler,
        store=store,
    )


def _store(run: Run) -> CheckpointStore:
    """The checkpoint store, its incomplete checkpoints removed by rank 0 while the others wait."""
    store = CheckpointStore(run.output / "checkpoints", run.spec.checkpoints.keep)
    if run.main:
        for removed in store.clean_incomplete():
            log.warning("removed incomplete checkpoint %s", removed)
            emit("checkpointDiscarded", name=removed)
    topology.barrier(run.ranks)
    return store


def _guard(model: nn.Module, precision: str) -> GuardReport | None:
    if precision != "fp32":
        return None
    report = GuardReport()
    report.recast = recast_to_fp32(model)
    faults.current().before_guard(model)
    scan_tensors(model, report)
    fail_if_half(report)
    return report

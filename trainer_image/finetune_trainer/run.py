"""One training run, start to finish: checks, load, guard, train with resume, export.

The order is the point: everything that can fail cheaply (config, hardware, data, memory plan)
fails before a single weight is loaded, and nothing is trained before the precision guard has
passed.
"""

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from finetune_api.trainer_config import TrainerConfig

from . import test_hooks
from .checkpoints import Checkpoint, CheckpointStore
from .data.loading import check_dataset, split
from .export import save_adapter, save_merged, write_summary
from .hardware import (
    choose_attention,
    configure_cpu_threads,
    detect,
    disable_compiler_if_unsupported,
    disable_triton_kernels,
    resolve_precision,
)
from .model_loading import DTYPES, load_model, load_model_config, load_tokenizer
from .precision_guard import fail_if_half, recast_to_fp32, scan_tensors
from .preflight import plan_memory
from .progress import ProgressCallback, emit
from .self_check import check_gpu_stack
from .status_patch import StatusReporter
from .trainer_build import build_trainer, checkpoint_ref, training_arguments

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


def train(config: TrainerConfig) -> dict[str, Any]:
    started = time.time()
    spec = config.spec
    output = Path(config.paths.output)
    output.mkdir(parents=True, exist_ok=True)

    hardware = detect(spec)
    threads = configure_cpu_threads(spec)
    facts = check_gpu_stack() if hardware.on_gpu else {}
    compiler_off = disable_compiler_if_unsupported(hardware)
    triton_off = disable_triton_kernels() if compiler_off else False
    precision = resolve_precision(spec.precision, hardware)
    log.info(
        "hardware: %s, %d CPU threads; precision %s; torch.compile %s; Triton kernels %s",
        hardware.describe(),
        threads,
        precision,
        "off" if compiler_off else "allowed",
        "off" if triton_off else "allowed",
    )

    model_config = load_model_config(config)
    tokenizer = load_tokenizer(config)
    data = check_dataset(config, tokenizer, model_config)
    attention = choose_attention(hardware, _head_dim(model_config), DTYPES[precision])
    plan = plan_memory(config, hardware, model_config, attention)

    from transformers import set_seed

    set_seed(spec.training.seed)
    model = load_model(config, hardware, precision, attention, plan)
    train_set, eval_set = split(data.samples, spec.dataset.eval_fraction, spec.training.seed)

    store = CheckpointStore(output / "checkpoints", spec.checkpoints.keep)
    for removed in store.clean_incomplete():
        log.warning("removed incomplete checkpoint %s", removed)
        emit("checkpointDiscarded", name=removed)
    resume = store.latest()
    if resume is not None:
        log.info("resuming from checkpoint %d (%s)", resume.step, resume.path)

    reporter = StatusReporter.from_environment(config.job_name, config.namespace)
    progress = ProgressCallback(reporter)
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(output / "tensorboard")
    arguments = training_arguments(config, hardware, precision, store.root, eval_set is not None)
    trainer = build_trainer(
        model=model,
        tokenizer=tokenizer,
        train_dataset=train_set,
        eval_dataset=eval_set,
        arguments=arguments,
        store=store,
        callbacks=[progress],
    )

    def on_checkpoint(checkpoint: Checkpoint) -> None:
        emit("checkpoint", **checkpoint_ref(checkpoint))
        if reporter is not None:
            reporter.progress(progress.status_progress())
            reporter.checkpoint(checkpoint.step, str(checkpoint.path), checkpoint.time)

    trainer.on_checkpoint = on_checkpoint

    report = trainer.guard_report
    if precision == "fp32":
        # The trainer's model, not ours: the SFTTrainer constructor is what casts behind our back.
        built = trainer.model
        assert built is not None
        report.recast = recast_to_fp32(built)
        planted = test_hooks.plant_half()
        if planted:
            _plant_half(built, planted)
        scan_tensors(built, report)
        fail_if_half(report)
        trainer.guard_first_step = True

    emit(
        "start",
        job=config.job_name,
        hardware=hardware.describe(),
        precision=precision,
        attention=attention,
        memoryPlan=plan.source,
        resumeFrom=checkpoint_ref(resume) if resume else None,
        samples=len(train_set),
        evalSamples=len(eval_set) if eval_set is not None else 0,
    )
    try:
        result = trainer.train(resume_from_checkpoint=str(resume.path) if resume else None)
        adapter = save_adapter(trainer.model, tokenizer, output)
        eval_loss = None
        if eval_set is not None:
            if progress.eval_step != trainer.state.global_step:
                trainer.evaluate()  # the progress callback records and prints it
            eval_loss = progress.eval_loss
        merged = save_merged(config, adapter, tokenizer, output) if spec.output.merge else None
        if reporter is not None:
            reporter.progress(progress.status_progress())
    finally:
        if reporter is not None:
            reporter.close()

    latest = store.latest()
    summary = {
        "job": config.job_name,
        "finalStep": trainer.state.global_step,
        "totalSteps": trainer.state.max_steps,
        "firstLoss": progress.first_loss,
        "finalLoss": progress.last.get("loss"),
        "trainLoss": result.training_loss,
        "evalLoss": eval_loss,
        "tokensPerSecond": progress.last.get("tokensPerSecond"),
        "adapterPath": str(adapter),
        "mergedPath": str(merged) if merged else None,
        "resumedFrom": checkpoint_ref(resume) if resume else None,
        "lastCheckpoint": checkpoint_ref(latest) if latest else None,
        "precision": precision,
        "attention": attention,
        "hardware": hardware.describe(),
        "gpuStack": facts,
        "memoryPlan": {"source": plan.source, **plan.summary},
        "precisionGuard": report.summary() if precision == "fp32" else None,
        "data": data.summary(),
        "lossSpikes": progress.spikes.spikes,
        "statusPatches": {"sent": reporter.sent, "failed": reporter.failed} if reporter else None,
        "peakGiBPerGpu": [round(torch.cuda.max_memory_allocated(g.index) / 2**30, 2) for g in hardware.gpus],
        "seconds": round(time.time() - started, 1),
    }
    write_summary(output, summary)
    emit("done", **{k: summary[k] for k in ("finalStep", "finalLoss", "evalLoss", "adapterPath", "precisionGuard")})
    return summary

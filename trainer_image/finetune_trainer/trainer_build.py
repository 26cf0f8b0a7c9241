"""The TRL SFTTrainer for a job: Pascal-safe arguments, atomic checkpoints, the guard, the loss watch.

Kept apart from model loading and from the run loop so that another launch mode (FSDP) can
reuse the same trainer class with a differently prepared model.
"""

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from trl.trainer.sft_config import SFTConfig
from trl.trainer.sft_trainer import SFTTrainer

from finetune_api.reasons import ExitReason
from finetune_api.trainer_config import TrainerConfig

from . import test_hooks
from .checkpoints import Checkpoint, CheckpointStore
from .failures import TrainerFailure
from .hardware import Hardware, ResolvedPrecision
from .precision_guard import GuardReport, fail_if_half, watch_activations

log = logging.getLogger(__name__)


class FineTuneTrainer(SFTTrainer):
    """SFTTrainer whose checkpoints are atomic and whose first step is precision-checked."""

    checkpoint_store: CheckpointStore
    guard_report: GuardReport
    guard_first_step: bool = False
    on_checkpoint: Any = None
    _staging_root: str | None = None

    def _get_output_dir(self, trial: Any) -> str:
        # While a checkpoint is being saved, everything goes into its staging folder.
        if self._staging_root is not None:
            return self._staging_root
        return str(super()._get_output_dir(trial))

    def _save_checkpoint(self, model: nn.Module, trial: Any) -> None:
        step = self.state.global_step
        self._staging_root = str(self.checkpoint_store.begin(step))
        try:
            super()._save_checkpoint(model, trial)  # type: ignore[no-untyped-call]
        finally:
            self._staging_root = None
        test_hooks.die_in_save(step)
        checkpoint = self.checkpoint_store.commit(step)
        log.info("checkpoint %d complete: %s", step, checkpoint.path)
        if self.on_checkpoint is not None:
            self.on_checkpoint(checkpoint)

    def _run_epoch(self, *args: Any, **kwargs: Any) -> None:
        # Resumed from the final checkpoint (a pod stopped between the last save and the end):
        # Hugging Face's epoch loop would still run one step past max_steps before checking.
        if self.state.max_steps > 0 and self.state.global_step >= self.state.max_steps:
            self.control.should_training_stop = True
            return
        super()._run_epoch(*args, **kwargs)  # type: ignore[no-untyped-call]

    def training_step(self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        step = self.state.global_step + 1
        if self.guard_first_step:
            with watch_activations(model, self.guard_report):
                loss: torch.Tensor = super().training_step(model, inputs, num_items_in_batch)  # type: ignore[no-untyped-call]
            self.guard_first_step = False
            fail_if_half(self.guard_report)
        else:
            loss = super().training_step(model, inputs, num_items_in_batch)  # type: ignore[no-untyped-call]
        if test_hooks.nonfinite_at(step):
            loss = loss * float("nan")
        delay = test_hooks.step_delay()
        if delay:
            time.sleep(delay)
        value = float(loss.detach().float().item())
        if not math.isfinite(value):
            last = self.checkpoint_store.latest()
            kept = f"last good checkpoint: step {last.step} ({last.path})" if last else "no checkpoint written yet"
            raise TrainerFailure(
                ExitReason.NonFiniteLoss,
                f"loss is {value} at step {step}; training stopped, {kept}. Lower the learning rate or check the data",
            )
        return loss


def training_arguments(
    config: TrainerConfig, hardware: Hardware, precision: ResolvedPrecision, checkpoints_dir: Path, has_eval: bool
) -> SFTConfig:
    t = config.spec.training
    c = config.spec.checkpoints
    length: dict[str, Any] = {"max_steps": t.max_steps} if t.max_steps else {"num_train_epochs": t.epochs or 1.0}
    evaluation: dict[str, Any] = {}
    if has_eval:
        evaluation = {"eval_strategy": "steps", "eval_steps": c.every_steps, "per_device_eval_batch_size": t.batch_size}
    return SFTConfig(
        output_dir=str(checkpoints_dir),
        **length,
        **evaluation,
        learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler,
        # transformers 5 takes the ratio here: a float below 1 is a fraction of the total steps.
        warmup_steps=t.warmup_ratio,
        lr_scheduler_kwargs={"min_lr_rate": 0.1} if t.lr_scheduler == "cosine_with_min_lr" else None,
        per_device_train_batch_size=t.batch_size,
        gradient_accumulation_steps=t.gradient_accumulation,
        max_length=t.max_length,
        packing=t.packing,
        gradient_checkpointing=t.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        optim=t.optimizer,
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm,
        logging_steps=t.logging_steps,
        logging_first_step=True,
        logging_nan_inf_filter=False,
        seed=t.seed,
        data_seed=t.seed,
        # Pure FP32 unless the hardware has native bf16 and the spec asked for (or auto chose) it.
        fp16=precision == "fp16",
        bf16=precision == "bf16",
        tf32=False if hardware.on_gpu and (hardware.min_capability or (0, 0)) >= (8, 0) else None,
        use_cpu=not hardware.on_gpu,
        save_strategy="steps",
        save_steps=c.every_steps,
        save_total_limit=None,  # retention is the CheckpointStore's job: it counts complete ones only
        report_to=["tensorboard"],
        include_num_input_tokens_seen="non_padding",
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=True,
        dataset_num_proc=None,
    )


def build_trainer(
    *,
    model: nn.Module,
    tokenizer: Any,
    train_dataset: Any,
    eval_dataset: Any,
    arguments: SFTConfig,
    store: CheckpointStore,
    callbacks: list[Any],
) -> FineTuneTrainer:
    from transformers.trainer_callback import PrinterCallback

    trainer = FineTuneTrainer(
        model=model,  # type: ignore[arg-type]
        args=arguments,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
    )
    # Our progress lines replace the dict printing on stdout.
    trainer.remove_callback(PrinterCallback)
    trainer.checkpoint_store = store
    trainer.guard_report = GuardReport()
    return trainer


def checkpoint_ref(checkpoint: Checkpoint) -> dict[str, Any]:
    return {"step": checkpoint.step, "path": str(checkpoint.path), "time": checkpoint.time}

"""One notch tighter: the memory savers an attempt that ran out of GPU memory retries with.

The planner's margin is measured, not proven: a longer sample, fragmentation or a neighbour on
the GPU can still take a job over. The trainer then retries once from its last checkpoint with
the savers below, each of which keeps the math (the same samples in the same order, the same
effective batch, the same loss), so the adapter matches an uninterrupted run's up to rounding:

- the loss in chunks of tokens inside the LM head (no whole-sequence logits);
- gradient checkpointing (the recomputed forward restores each layer's RNG state, so even the
  dropout masks are the same);
- the evaluation's micro-batch halved (evaluation trains nothing);
- the micro-batch split by its smallest prime factor with the accumulation multiplied by it:
  a step still sums the same rows (`data.batches.Schedule` slices one order by the step), and
  the loss is still scaled by the step's global target count. LoRA dropout draws its masks per
  micro-batch, so with dropout on a split draws other masks (the same objective, another draw):
  then it is taken only when no exact saver is left.

Pure: the trainer applies a `Savers` to its spec (`apply`) and to its loss head.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from finetune_api.spec import FineTuneJobSpec

from .recompute.ask import ActivationAsk
from .search.chunks import LOSS_CHUNK_TOKENS

# Below this a smaller loss chunk saves less than the chunking's own bookkeeping.
MIN_LOSS_CHUNK_TOKENS: Final = 64


@dataclass(frozen=True)
class Savers:
    """The settings that change an attempt's memory and not its math."""

    loss_chunk_tokens: int  # 0: the whole sequence's logits at once
    gradient_checkpointing: bool
    batch_size: int  # the training micro-batch
    gradient_accumulation: int
    eval_batch_size: int

    @property
    def effective_micro(self) -> int:
        """Samples a process trains per step: the notch keeps it."""
        return self.batch_size * self.gradient_accumulation

    def describe(self) -> str:
        """One phrase a user reads in the status message, e.g. `loss chunks 512, micro-batch 1 x 8`."""
        chunks = f"loss chunks {self.loss_chunk_tokens}" if self.loss_chunk_tokens else "whole-sequence loss"
        return (
            f"{chunks}, micro-batch {self.batch_size} x {self.gradient_accumulation}, "
            f"eval micro-batch {self.eval_batch_size}, "
            f"gradient checkpointing {'on' if self.gradient_checkpointing else 'off'}"
        )


def savers_of(spec: FineTuneJobSpec, loss_chunk_tokens: int) -> Savers:
    """The savers an attempt of `spec` ran with, its loss chunk size as the plan chose it."""
    training = spec.training
    return Savers(
        loss_chunk_tokens=loss_chunk_tokens,
        # auto keeps some layers' activations: the notch checkpoints them all.
        gradient_checkpointing=ActivationAsk.of(training).recomputes_all,
        batch_size=training.batch_size,
        gradient_accumulation=training.gradient_accumulation,
        eval_batch_size=training.batch_size,
    )


def _smallest_factor(n: int) -> int:
    return next(p for p in range(2, n + 1) if n % p == 0)


def tighter(savers: Savers, *, dropout: bool) -> Savers | None:
    """One notch tighter than `savers` with the same math, or None when none is left.

    The notch turns on every exact saver still off (loss chunks, gradient checkpointing) and
    halves the eval micro-batch; it splits the training micro-batch too when that is exact
    (no LoRA dropout) or when no exact saver was left to turn on. When everything is on and the
    micro-batch is 1, it halves the loss chunk, down to MIN_LOSS_CHUNK_TOKENS."""
    exact = replace(
        savers,
        loss_chunk_tokens=savers.loss_chunk_tokens or LOSS_CHUNK_TOKENS,
        gradient_checkpointing=True,
        eval_batch_size=max(1, savers.eval_batch_size // 2),
    )
    turned_on = (exact.loss_chunk_tokens, exact.gradient_checkpointing) != (
        savers.loss_chunk_tokens,
        savers.gradient_checkpointing,
    )
    notch = exact
    if savers.batch_size > 1 and (not dropout or not turned_on):
        factor = _smallest_factor(savers.batch_size)
        notch = replace(
            exact,
            batch_size=savers.batch_size // factor,
            gradient_accumulation=savers.gradient_accumulation * factor,
        )
    if notch == savers and savers.loss_chunk_tokens > MIN_LOSS_CHUNK_TOKENS:
        notch = replace(savers, loss_chunk_tokens=max(MIN_LOSS_CHUNK_TOKENS, savers.loss_chunk_tokens // 2))
    return None if notch == savers else notch


def apply(spec: FineTuneJobSpec, savers: Savers) -> FineTuneJobSpec:
    """`spec` training with `savers` (the loss chunk and eval micro-batch are not spec fields:
    the trainer hands those to its loss head and loop itself)."""
    training = spec.training.model_copy(
        update={
            "batch_size": savers.batch_size,
            "gradient_accumulation": savers.gradient_accumulation,
            "gradient_checkpointing": savers.gradient_checkpointing,
            # Every layer recomputing: none is kept, whatever training.keptLayers said of auto.
            "kept_layers": None if savers.gradient_checkpointing else spec.training.kept_layers,
        }
    )
    return spec.model_copy(update={"training": training})

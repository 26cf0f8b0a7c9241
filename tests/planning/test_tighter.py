"""The notch an attempt that ran out of GPU memory retries with: tighter, with the same math."""

from finetune_plan import GIB, choose
from finetune_plan.tighter import MIN_LOSS_CHUNK_TOKENS, Savers, apply, savers_of, tighter
from tests.support.specs import spec

from .models import LLAMA_3_8B


def savers(
    chunks: int = 0, checkpointing: bool = False, batch: int = 4, accumulation: int = 2, evals: int = 4
) -> Savers:
    return Savers(chunks, checkpointing, batch, accumulation, evals)


def test_without_dropout_every_saver_goes_on_at_once_and_the_effective_batch_stays() -> None:
    notch = tighter(savers(), dropout=False)
    assert notch == Savers(512, True, 2, 4, 2)
    assert notch.effective_micro == savers().effective_micro
    assert notch.describe() == ("loss chunks 512, micro-batch 2 x 4, eval micro-batch 2, gradient checkpointing on")


def test_a_micro_batch_splits_by_its_smallest_factor() -> None:
    assert tighter(savers(512, True, batch=3, accumulation=5, evals=3), dropout=False) == Savers(512, True, 1, 15, 1)
    assert tighter(savers(512, True, batch=6, accumulation=1, evals=6), dropout=False) == Savers(512, True, 3, 2, 3)


def test_with_dropout_the_split_waits_until_no_exact_saver_is_left() -> None:
    # LoRA dropout draws its masks per micro-batch: a split draws others, so exact savers first.
    assert tighter(savers(0, False, batch=4), dropout=True) == Savers(512, True, 4, 2, 2)
    assert tighter(savers(512, True, batch=4), dropout=True) == Savers(512, True, 2, 4, 2)


def test_at_micro_batch_one_the_loss_chunk_halves_and_then_nothing_is_left() -> None:
    last = savers(128, True, batch=1, accumulation=8, evals=1)
    assert tighter(last, dropout=True) == Savers(MIN_LOSS_CHUNK_TOKENS, True, 1, 8, 1)
    assert tighter(Savers(MIN_LOSS_CHUNK_TOKENS, True, 1, 8, 1), dropout=True) is None


def test_the_savers_of_a_spec_and_back() -> None:
    job = spec(training={"batchSize": 4, "gradientAccumulation": 2, "gradientCheckpointing": False})
    ran = savers_of(job, 0)
    assert ran == Savers(0, False, 4, 2, 4)
    notch = tighter(ran, dropout=job.lora.dropout > 0)
    assert notch is not None
    tightened = apply(job, notch)
    training = tightened.training
    assert (training.batch_size, training.gradient_accumulation, training.gradient_checkpointing) == (4, 2, True)
    assert tightened.effective_batch(1) == job.effective_batch(1)
    assert tightened.training.max_length == job.training.max_length and tightened.lora == job.lora


def test_the_retry_is_planned_again_with_its_savers_and_needs_less_memory() -> None:
    """8B on one P40 at batch 4 without checkpointing: the plan the trainer makes for the retry
    (its spec with the notch, the loss chunk the notch names) peaks lower than the first one."""
    job = spec(
        model={"source": {"hub": {"id": "meta-llama/Llama-3.1-8B"}}},
        training={"batchSize": 4, "gradientAccumulation": 2, "maxLength": 1024, "gradientCheckpointing": False},
        resources={"gpus": 1},
    )
    first = choose(job, LLAMA_3_8B, 1, int(48 * GIB))
    assert first.plan is not None
    notch = tighter(savers_of(job, first.plan.recipe.loss_chunk_tokens), dropout=job.lora.dropout > 0)
    assert notch is not None
    retry = choose(apply(job, notch), LLAMA_3_8B, 1, int(48 * GIB), loss_chunks=(notch.loss_chunk_tokens,))
    assert retry.plan is not None and retry.plan.recipe.loss_chunk_tokens == notch.loss_chunk_tokens
    assert retry.plan.layout.fullest.total < first.plan.layout.fullest.total

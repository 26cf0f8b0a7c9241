"""How long the evaluation on the held-out split takes (spec.evaluation), by the plan.

What the trainer runs with a held-out split (dataset.evalFraction or dataset.eval), and how each
is timed here, at the plan's rates:

- the held-out loss at every checkpoint by steps (everySteps, and the last step), as it ran
  before the evaluation existed: one tuned pass each (`loss_passes`);
- the base, once before training (`evaluation.base`): one pass with the adapter off. No
  gradient is needed, so no backward runs: each eval micro-batch is the model's forward
  without gradients (`speed.forward_seconds`, the card's FP32 rate for the matmuls and its
  bandwidth for the NF4 dequantisation), as DPO's reference forwards are timed (unquantised
  weights with checkpointing are the exception: the trainer makes the embeddings' output need
  a gradient there, so the base pass runs as the tuned one does, `base_backward`);
- the tuned model after training, and at every checkpoint but the last with
  `evaluation.atCheckpoints`: one pass each, which runs as a training micro-batch does (its
  forward with gradients, the recompute, a zero backward; the trainer's
  evaluation/passes.py says why), so a micro-batch costs the plan's micro-batch less the
  optimizer's share of a step;
- the greedy answers of both models to `generate.count` held-out examples: where rank 0 answers
  alone (every mode but fsdp) the trainer keeps transformers' KV cache (outputs/samples.py), so
  an answer is one forward over the prompt and a one-token forward per further token; under fsdp
  the ranks answer in lockstep without a cache, so every new token is one forward of a row over
  the prompt and the tokens so far (`generation_cached`). The forward's dequantisation traffic is
  the weight-bytes-over-bandwidth term of a decoding step, its matmuls the FP32-rate term. Under
  fsdp the tuned model's token is a trained pass of the row (a zero backward follows its
  forward, as the trainer runs it), and every pass at least its gathers.

Every pass's micro-batches are the training micro-batch's rows at full maxLength (as the job's
time plans its steps) and are split over the ranks (`data.batches.eval_slots`); the answers are
rank 0's alone. The evaluation reuses the training's model: it holds no second copy of the
weights, and a pass holds no more than a step; the answers' logits for every position of the
longest row are the one transient that can outgrow the training's (`memory_note`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from finetune_api.spec import FineTuneJobSpec

from . import calibration as cal
from .memory import FP32, GIB, GpuMemory, Recipe
from .messages.report import duration
from .results.plan import Plan
from .speed import compute_seconds, forward_seconds, gather_bytes, reference_seconds

# Data formats whose rows hold no reference answer to score a greedy answer against.
NO_REFERENCE_FORMATS = ("text",)


def generation_cached(plan: Plan) -> bool:
    """Whether the answers decode with a KV cache (the prefill once, then a one-token forward per
    token): where rank 0 answers alone. fsdp's lockstep forwards each token over the whole row."""
    return plan.mode != "fsdp"


@dataclass(frozen=True)
class EvaluationTime:
    """The evaluation's seconds by part; a pass's are None where the held-out size is unknown."""

    examples: int | None  # held-out rows measured
    base: float | None  # one base pass (0 with evaluation.base false)
    tuned: float | None  # one tuned pass
    tuned_passes: int  # after training, and at checkpoints with atCheckpoints
    loss_passes: int  # the held-out loss at the checkpoints by steps
    generation: float  # both models' answers
    generated: int  # answers per model
    memory_note: str | None = None

    @property
    def measured(self) -> float | None:
        """What evaluation.json's `seconds` add up to: the base, the tuned model after training,
        the answers."""
        if self.base is None or self.tuned is None:
            return None
        return self.base + self.tuned + self.generation

    @property
    def seconds(self) -> float | None:
        """Everything the held-out split adds to the job's time."""
        if self.base is None or self.tuned is None:
            return None
        return self.base + self.tuned * (self.tuned_passes + self.loss_passes) + self.generation

    def ahead(self, step: int, total_steps: int, every_steps: int, *, at_checkpoints: bool) -> float | None:
        """The evaluation's seconds still to run after optimizer step `step` of `total_steps` (for
        an ETA): the held-out loss at each checkpoint by steps still ahead, the tuned model at
        those before the last with `at_checkpoints`, the tuned model after training and the
        answers. The base is behind by then (it runs before the first step)."""
        if self.tuned is None:
            return None
        due = [s for s in range(step + 1, total_steps + 1) if s % every_steps == 0 or s == total_steps]
        before_last = sum(1 for s in due if s < total_steps) if at_checkpoints else 0
        return self.tuned * (len(due) + before_last + 1) + self.generation

    def to_dict(self) -> dict[str, float | int | str | None]:
        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 1)

        return {
            "seconds": rounded(self.seconds),
            "examples": self.examples,
            "base": rounded(self.base),
            "tuned": rounded(self.tuned),
            "tunedPasses": self.tuned_passes,
            "lossPasses": self.loss_passes,
            "generation": rounded(self.generation),
            "generated": self.generated,
            "memoryNote": self.memory_note,
        }


def ranks(plan: Plan, spec: FineTuneJobSpec) -> int:
    """The processes the held-out micro-batches are split over: one per GPU of every pod, or the
    one process of deviceMap."""
    return 1 if plan.mode == "device_map" else plan.hardware.gpus * spec.resources.nodes


def micro_batches(examples: int, plan: Plan, spec: FineTuneJobSpec) -> int:
    """Each rank's eval micro-batches of `examples` held-out rows (every rank the same count)."""
    rows = max(1, plan.recipe.rows)
    return math.ceil(math.ceil(examples / rows) / ranks(plan, spec))


def _gather_seconds(plan: Plan, recipe: Recipe, *, trained: bool) -> float:
    """fsdp: one pass's weight gathers over the link (a forward gathers every layer and the head
    once; a trained pass twice, `speed.gather_bytes`); 0 in the other modes."""
    if plan.mode != "fsdp":
        return 0.0
    one = replace(recipe, reference_forwards=0, pair_split=False)
    moved = gather_bytes(plan.shape, one, plan.hardware.gpus) / (1 if trained else 2)
    return moved / (plan.hardware.product.link_gbps * 1e9 * cal.BANDWIDTH_UTILISATION)


def _hops(plan: Plan, passes: int) -> float:
    """deviceMap: the hand-overs of the hidden states at each boundary, per pass."""
    return (plan.hardware.gpus - 1) * cal.DEVICE_HOP_SECONDS * passes if plan.mode == "device_map" else 0.0


def base_backward(plan: Plan) -> bool:
    """Whether the base pass runs a backward too: only where the trainer makes the embeddings'
    output need a gradient (unquantised weights with checkpointing), so the adapter-off forward
    still builds a graph and the pass's zero backward goes through every layer."""
    return plan.recipe.quantization == "none" and plan.recipe.gradient_checkpointing


def base_micro_seconds(plan: Plan, accumulation: int) -> float:
    """One eval micro-batch with the adapter off: a forward without gradients of each sequence
    (and DPO's reference forward, also adapter off), deviceMap's hand-overs, and under fsdp at
    least one forward's weight gathers."""
    if base_backward(plan):
        return tuned_micro_seconds(plan, accumulation)
    shape, recipe, product = plan.shape, plan.recipe, plan.hardware.product
    seconds = recipe.grad_passes * forward_seconds(shape, recipe, product, adapters=False)
    seconds += reference_seconds(shape, recipe, product) + _hops(plan, recipe.grad_passes)
    return max(seconds, _gather_seconds(plan, recipe, trained=False))


def tuned_micro_seconds(plan: Plan, accumulation: int) -> float:
    """One eval micro-batch of the tuned model: a training micro-batch without the optimizer's share."""
    assert plan.speed is not None
    return max(0.0, plan.speed.step_seconds - cal.STEP_SECONDS / max(1, accumulation))


def row_forward_seconds(plan: Plan, tokens: int, *, adapters: bool) -> float:
    """One row of `tokens` tokens through the model for one greedy token: a forward without
    gradients. Under fsdp the ranks answer in lockstep with gradients on, and the tuned model's
    forward has a zero backward after it (the trainer's outputs/samples.py): a trained pass of the
    row; each pass at least its weight gathers. deviceMap adds its hand-overs."""
    row = replace(plan.recipe, batch_size=1, max_length=max(1, tokens), sequences_per_row=1, pair_split=False)
    row = replace(row, reference_forwards=0)
    shape, product = plan.shape, plan.hardware.product
    trained = plan.mode == "fsdp" and adapters
    if trained:
        seconds = compute_seconds(shape, row, product) - cal.STEP_SECONDS / max(1, row.gradient_accumulation)
    else:
        seconds = forward_seconds(shape, row, product, adapters=adapters)
    return max(seconds + _hops(plan, 1), _gather_seconds(plan, row, trained=trained))


def answer_seconds(plan: Plan, prompt_tokens: int, new_tokens: int, *, adapters: bool) -> float:
    """One greedy answer of `new_tokens` tokens to a prompt of `prompt_tokens`: without a cache,
    one forward over the row so far per token; with one, the prompt once and a one-token forward
    per further token."""
    if generation_cached(plan):
        first = row_forward_seconds(plan, prompt_tokens, adapters=adapters)
        return first + (new_tokens - 1) * row_forward_seconds(plan, 1, adapters=adapters)
    return sum(row_forward_seconds(plan, prompt_tokens + t, adapters=adapters) for t in range(new_tokens))


def checkpoint_passes(total_steps: int | None, every_steps: int) -> tuple[int, int]:
    """(checkpoints by steps, of them before the last step) over `total_steps` steps."""
    if not total_steps:
        return 1, 0
    return total_steps // every_steps + (1 if total_steps % every_steps else 0), (total_steps - 1) // every_steps


def generation_bytes(plan: Plan, tokens: int) -> float:
    """The answers' transient: the logits of every position of the longest row, in FP32 (the
    trainer's forward takes the whole vocabulary at each position)."""
    return float(tokens * plan.shape.vocab * FP32)


def memory_note(plan: Plan, tokens: int) -> str | None:
    """Where the answers' logits outgrow what the training's step leaves free on the GPU that
    holds the head: the step's activations and transients, and its headroom."""
    head: GpuMemory = plan.layout.per_gpu[-1] if plan.mode == "device_map" else plan.layout.fullest
    room = head.activations + max(head.temporaries, head.logits) + head.headroom
    need = generation_bytes(plan, tokens)
    if need <= room:
        return None
    return (
        f"the answers' logits ({tokens:,} positions x {plan.shape.vocab:,} in FP32, {need / GIB:.1f} GiB) may not "
        f"fit beside the weights ({room / GIB:.1f} GiB free of the step's): lower evaluation.generate.maxNewTokens "
        "or generate.count 0"
    )


def evaluation_time(
    plan: Plan,
    spec: FineTuneJobSpec,
    examples: int | None,
    *,
    total_steps: int | None = None,
    prompt_tokens: int | None = None,
) -> EvaluationTime | None:
    """The evaluation of a job with `examples` held-out rows (None: not known here) over
    `total_steps` steps (None: maxSteps, or unknown); prompts of `prompt_tokens` tokens (None:
    maxLength, the longest a row holds). None without a held-out split or a speed."""
    if not spec.dataset.held_out or plan.speed is None:
        return None
    asked, training = spec.evaluation, spec.training
    steps = total_steps if total_steps is not None else training.max_steps
    loss_passes, before_last = checkpoint_passes(steps, spec.checkpoints.every_steps)
    tuned_passes = 1 + (before_last if asked.at_checkpoints else 0)
    count = 0 if spec.dataset.format in NO_REFERENCE_FORMATS else asked.generate.count
    generated = count if examples is None else min(count, examples)
    prompt = prompt_tokens if prompt_tokens is not None else training.max_length
    new = asked.generate.max_new_tokens
    generation = generated * sum(answer_seconds(plan, prompt, new, adapters=a) for a in (True, False))
    note = memory_note(plan, prompt + new) if generated else None
    if examples is None:
        return EvaluationTime(None, None, None, tuned_passes, loss_passes, generation, generated, note)
    micro = micro_batches(examples, plan, spec)
    base = micro * base_micro_seconds(plan, training.gradient_accumulation) if asked.base else 0.0
    tuned = micro * tuned_micro_seconds(plan, training.gradient_accumulation)
    return EvaluationTime(examples, base, tuned, tuned_passes, loss_passes, generation, generated, note)


def held_out_examples(spec: FineTuneJobSpec, records: int | None, held_out_records: int | None = None) -> int | None:
    """The held-out rows: dataset.eval's records, or evalFraction of the training data's (as the
    trainer splits them: at least one)."""
    if spec.dataset.eval is not None:
        return held_out_records
    if records is None or not spec.dataset.eval_fraction:
        return None
    return max(1, round(records * spec.dataset.eval_fraction))


def _said(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds < 100 else duration(seconds)


def describe(timed: EvaluationTime) -> str:
    """The evaluation's line of `ftjob plan`, after the word `evaluation`."""
    parts = []
    if timed.base is not None and timed.tuned is not None:
        if timed.base:
            parts.append(f"base {_said(timed.base)}")
        parts.append(f"tuned {_said(timed.tuned)}" + (f" x {timed.tuned_passes}" if timed.tuned_passes > 1 else ""))
        if timed.loss_passes:
            parts.append(f"held-out loss at {timed.loss_passes} checkpoint(s) {_said(timed.tuned * timed.loss_passes)}")
    if timed.generated:
        parts.append(f"{timed.generated} answer(s) x 2 models {_said(timed.generation)}")
    what = ", ".join(parts)
    if timed.seconds is None:
        return f"not known yet: held-out examples unknown here ({what or 'no answers'}); pass --eval-examples N"
    note = f"; {timed.memory_note}" if timed.memory_note else ""
    return f"about {duration(timed.seconds)} on {timed.examples:,} held-out examples: {what}{note}"

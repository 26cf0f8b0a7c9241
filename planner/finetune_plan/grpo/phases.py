"""GRPO's phases without gradients, in bytes on one GPU above what stays there (the weights, the
adapter and its optimizer): the layouts put the larger in `GpuMemory.rollouts`, which the plan's
peak weighs against the trained pass's (`GpuMemory.allocated`).

- The rollouts with a KV cache (every mode but fsdp): k and v of every layer for G rows of up to
  P + C tokens (`kv_cache_bytes`), beside either the prefill's forward of G x P tokens (one
  layer's tensors at a time, as `layer_forward_bytes` counts them) or a one-token forward of the
  G rows: the NF4 weight dequantised for the matmul, each layer's cache read with k and v
  expanded to every query head (the trainer's attention kernels take them expanded) and the
  growing layer's old and new copies, and on the GPU holding the head the last position's logits
  of the G rows with sampling's copies of them (temperature, softmax, top-p's sort). Only the last
  position's logits are planned: the engine asks the model for those alone.
- The rollouts without a cache (fsdp): a forward of G rows of P + C tokens, the longest of the
  whole-row passes, with two layers gathered whole.
- The scored micro-batch's forwards without gradients (the old log-probabilities, the
  reference): one layer's tensors at a time and the log-probabilities' logits in the loss head's
  chunks. They never need more than the trained pass, which keeps every layer's checkpoint
  besides, but are planned for what they are.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from .. import memory as mem
from ..memory import FP32, GrpoTerms, Recipe
from ..model_shape import ModelShape

# Copies of the last position's logits that sampling holds at once: the logits, their
# temperature-scaled copy, the softmax, and top-p's sorted copy (an estimate: G x vocab floats
# are megabytes, beside a cache of gigabytes).
SAMPLING_LOGITS_COPIES: Final = 4.0


def terms(recipe: Recipe) -> GrpoTerms:
    """The recipe's GRPO terms; only for a GRPO recipe."""
    if recipe.grpo is None:
        raise ValueError("not a GRPO recipe: training.method is not grpo")
    return recipe.grpo


def row_lengths(recipe: Recipe) -> tuple[int, int]:
    """(prompt, completion) tokens of a row as planned: the completion maxCompletionLength, the
    prompt the rest of maxLength (the longest the data check allows); at least one prompt token."""
    completion = max(0, min(terms(recipe).max_completion_length, recipe.max_length - 1))
    return recipe.max_length - completion, completion


def rows_of(recipe: Recipe, tokens: int) -> Recipe:
    """One prompt's G rows of `tokens` tokens as the rollouts run them: one forward in eval mode
    (no dropout), nothing kept for a backward, no loss."""
    return replace(
        recipe,
        batch_size=terms(recipe).num_generations,
        max_length=max(1, tokens),
        sequences_per_row=1,
        pair_split=False,
        reference_forwards=0,
        lora_dropout=False,
        gradient_checkpointing=False,
        offload=False,
        offload_inputs=False,
        packing=False,
        loss_chunk_tokens=0,
    )


def kv_cache_bytes(shape: ModelShape, recipe: Recipe, layers: int | None = None, tokens: int | None = None) -> float:
    """The rollouts' KV cache of `layers` layers (default: every one) for `tokens` tokens (default:
    P + C, the longest row): 2 (k and v) x layers x kv_heads x head_dim x the compute dtype's bytes
    (fp32: 4) per token per row, for the G rows of one prompt."""
    count = shape.layers if layers is None else layers
    length = recipe.max_length if tokens is None else tokens
    return 2.0 * count * shape.kv_width * recipe.compute_bytes * terms(recipe).num_generations * length


def dequantised_bytes(shape: ModelShape, recipe: Recipe) -> float:
    """The largest linear's weight dequantised for a matmul of several rows (bitsandbytes takes
    its one-row kernel only for a single row)."""
    return shape.largest_linear_params * recipe.compute_bytes if recipe.quantization != "none" else 0.0


def layer_forward_bytes(shape: ModelShape, rows: Recipe) -> float:
    """One layer's forward without gradients over `rows`: the tensors it would keep for a
    backward (`memory.full_layer_activation_bytes`), alive at once before they are dropped, the
    weight dequantised for its matmul, and the fused kernel's mask where the batch has one."""
    return (
        mem.full_layer_activation_bytes(shape, rows) + dequantised_bytes(shape, rows) + mem.attention_mask_bytes(rows)
    )


def sampling_bytes(shape: ModelShape, recipe: Recipe) -> float:
    """The last position's logits of G rows in FP32 with sampling's copies."""
    return SAMPLING_LOGITS_COPIES * terms(recipe).num_generations * shape.vocab * FP32


def expanded_kv_bytes(shape: ModelShape, recipe: Recipe, tokens: int) -> float:
    """One layer's cached k and v expanded to every query head for one token's attention."""
    return 2.0 * terms(recipe).num_generations * tokens * shape.attention_width * recipe.compute_bytes


def cached_rollout_bytes(shape: ModelShape, recipe: Recipe, *, layers: int, head: bool) -> float:
    """The rollouts with a KV cache on a GPU of `layers` decoder layers (`head`: it holds the LM
    head): the prefill's phase or the last one-token forward's, the larger."""
    prompt, _ = row_lengths(recipe)
    logits = sampling_bytes(shape, recipe) if head else 0.0
    prefill_layer = layer_forward_bytes(shape, rows_of(recipe, prompt)) if layers else 0.0
    prefill = kv_cache_bytes(shape, recipe, layers, prompt) + max(prefill_layer, logits)
    one_layer_cache = kv_cache_bytes(shape, recipe, 1) if layers else 0.0
    attention = expanded_kv_bytes(shape, recipe, recipe.max_length) + one_layer_cache if layers else 0.0
    decode_layer = max(dequantised_bytes(shape, recipe) if layers else 0.0, attention)
    decode = kv_cache_bytes(shape, recipe, layers) + max(decode_layer, logits)
    return max(prefill, decode)


def uncached_rollout_bytes(shape: ModelShape, recipe: Recipe, *, gathered: float, head_gathered: float) -> float:
    """fsdp's rollouts: the last whole-row forward of G rows of P + C tokens, its layer beside the
    `gathered` layers' weights, or the head's logits beside the head gathered (`head_gathered`)."""
    layer = layer_forward_bytes(shape, rows_of(recipe, recipe.max_length)) + gathered
    return max(layer, sampling_bytes(shape, recipe) + head_gathered)


def scoring_forward_bytes(
    shape: ModelShape, recipe: Recipe, *, layers: int, head: bool, gathered: float = 0.0
) -> float:
    """A forward of the scored micro-batch without gradients (the old log-probabilities, the
    reference): one layer at a time (`gathered`: fsdp's gathered weights beside it), then on the
    head's GPU the last layer's output and the loss head's logits."""
    one_pass = replace(recipe, lora_dropout=False, gradient_checkpointing=False, offload=False, offload_inputs=False)
    layer = layer_forward_bytes(shape, one_pass) + gathered if layers else 0.0
    loss = mem.outside_layers_activation_bytes(shape, recipe) + mem.logits_bytes(shape, recipe) if head else 0.0
    return max(layer, loss)


def no_grad_bytes(shape: ModelShape, recipe: Recipe, *, layers: int, head: bool, cached: bool = True) -> float:
    """GRPO's phases without gradients on a GPU of `layers` decoder layers (`head`: it holds the
    LM head), the rollouts with a KV cache (every mode but fsdp) or without (`cached` False: fsdp
    on one GPU, nothing gathered), the larger; 0 for another method."""
    if recipe.grpo is None:
        return 0.0
    if cached:
        rollouts = cached_rollout_bytes(shape, recipe, layers=layers, head=head)
    else:
        rollouts = uncached_rollout_bytes(shape, recipe, gathered=0.0, head_gathered=0.0)
    return max(rollouts, scoring_forward_bytes(shape, recipe, layers=layers, head=head))


def fsdp_no_grad_bytes(shape: ModelShape, recipe: Recipe, *, gathered: float, head_gathered: float) -> float:
    """fsdp's phases without gradients on each rank, with the gathered weights beside them; 0 for
    another method."""
    if recipe.grpo is None:
        return 0.0
    rollouts = uncached_rollout_bytes(shape, recipe, gathered=gathered, head_gathered=head_gathered)
    layers_part = scoring_forward_bytes(shape, recipe, layers=shape.layers, head=False, gathered=gathered)
    head_part = scoring_forward_bytes(shape, recipe, layers=0, head=True) + head_gathered
    return max(rollouts, layers_part, head_part)

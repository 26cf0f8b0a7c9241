"""GRPO's seconds beside the trained micro-batch, at the plan's own rates (`speed`), and
`estimate`: the speed model's micro-batch with them added, which the search and the activation
sizing weigh for every recipe (another method's is `speed.estimate`'s, unchanged).

Per micro-batch (batchSize prompts), on one process:
- the rollouts (`rollout_seconds`), batchSize x one prompt's: with a KV cache, a prefill of G x P
  tokens (`speed.forward_seconds`: its matmuls at the FP32 rate, the dequantisation's bytes over
  the bandwidth, the layers' launches) and C - 1 one-token forwards of the G rows, each reading
  the weights as the plan counts their bytes (the NF4 linears dequantised, the FP32 head) and
  the cache at the card's memory bandwidth (`product.memory_gbps`, the data sheet's, x the
  calibrated utilisation); under fsdp, without a cache, a forward of the G rows over P + t tokens
  for each t = 0 .. C - 1 (quadratic in C), each at least one forward's weight gathers;
  deviceMap's hand-overs at every forward;
- the forward for the old log-probabilities where numIterations > 1 (`old_logp_seconds`): one
  forward of the scored micro-batch without gradients, adapter on;
- both shared by the numIterations optimizer steps one batch of rollouts serves;
- the reference forward (beta > 0) and the trained forward and backward: `speed.compute_seconds`
  (the recipe's `reference_forwards`), as DPO's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .. import calibration as cal
from ..bisection import smallest_fitting
from ..gpu_products import GpuProduct
from ..memory import FP32, Recipe, layer_packed_bytes
from ..model_shape import ModelShape
from ..speed import Mode, Speed, forward_seconds
from ..speed import estimate as trained_estimate
from .phases import kv_cache_bytes, row_lengths, rows_of, terms


def _bandwidth(product: GpuProduct) -> float:
    """Bytes per second a forward without gradients reads at: the data sheet's memory bandwidth x
    the utilisation NF4's dequantisation was measured to reach."""
    return product.memory_gbps * 1e9 * cal.BANDWIDTH_UTILISATION


def hop_seconds(mode: Mode, gpus: int) -> float:
    """deviceMap's hand-overs of the hidden states at each boundary, per forward."""
    return (gpus - 1) * cal.DEVICE_HOP_SECONDS if mode == "device_map" else 0.0


def forward_gather_seconds(shape: ModelShape, recipe: Recipe, product: GpuProduct, *, mode: Mode, gpus: int) -> float:
    """fsdp: one forward's weight gathers (every layer's packed bytes, the embedding and the head
    once, each rank receiving (N-1)/N of them); 0 in the other modes."""
    if mode != "fsdp" or gpus <= 1:
        return 0.0
    moved = shape.layers * layer_packed_bytes(shape, recipe)
    moved += shape.embedding_params * recipe.compute_bytes + shape.head_params * FP32
    return (gpus - 1) / gpus * moved / (product.link_gbps * 1e9 * cal.BANDWIDTH_UTILISATION)


def head_read_seconds(shape: ModelShape, recipe: Recipe, product: GpuProduct) -> float:
    """The LM head's weights read once (FP32; a tied head is the embedding in the compute dtype):
    at a few rows its matmul is bound by them."""
    per_weight = recipe.compute_bytes if shape.tied_embeddings else FP32
    return shape.vocab * shape.hidden * per_weight / _bandwidth(product)


def token_step_seconds(shape: ModelShape, recipe: Recipe, product: GpuProduct) -> float:
    """One one-token forward of the G rows, its cache's reads apart (`cache_seconds_per_token`):
    every layer's weights dequantised and launched, the adapters, the head's weights read."""
    return forward_seconds(shape, rows_of(recipe, 1), product, adapters=True) + head_read_seconds(
        shape, recipe, product
    )


def cache_seconds_per_token(shape: ModelShape, recipe: Recipe, product: GpuProduct) -> float:
    """A one-token forward's seconds per token in the cache (every layer, the G rows): the cache
    read once, and where heads share k and v, k and v expanded to every query head written and
    read again (the trainer's attention kernels take them expanded)."""
    groups = shape.attention_width / shape.kv_width
    passes = 1.0 + (2.0 * groups if groups > 1 else 0.0)
    return passes * kv_cache_bytes(shape, recipe, tokens=1) / _bandwidth(product)


def cached_prompt_seconds(shape: ModelShape, recipe: Recipe, product: GpuProduct, *, hops: float = 0.0) -> float:
    """One prompt's G completions with a KV cache: the prefill of G x P tokens (its first token),
    then C - 1 one-token forwards, the t-th over a cache of P + t tokens; `hops` per forward."""
    prompt, completion = row_lengths(recipe)
    prefill = forward_seconds(shape, rows_of(recipe, prompt), product, adapters=True) + hops
    steps = max(0, completion - 1)
    cached = steps * prompt + steps * (steps + 1) / 2  # the caches' tokens over the steps
    per_step = token_step_seconds(shape, recipe, product) + hops
    return prefill + steps * per_step + cached * cache_seconds_per_token(shape, recipe, product)


def _sum_of(c: tuple[float, float, float], low: int, high: int) -> float:
    """The sum of c0 + c1 x + c2 x^2 over the whole numbers x in [low, high]."""

    def ones(n: int) -> float:
        return float(n)

    def firsts(n: int) -> float:
        return n * (n + 1) / 2

    def squares(n: int) -> float:
        return n * (n + 1) * (2 * n + 1) / 6

    if high < low:
        return 0.0
    sums = [f(high) - f(low - 1) for f in (ones, firsts, squares)]
    return c[0] * sums[0] + c[1] * sums[1] + c[2] * sums[2]


def summed_passes(seconds: Callable[[int], float], first: int, count: int, floor: float = 0.0) -> float:
    """The sum over L = first .. first + count - 1 of max(seconds(L), floor), for `seconds` a
    quadratic in L that rises with it (a forward of rows of L tokens): in closed form from three
    of its values, so a completion of thousands of tokens costs three forwards' arithmetic."""
    last = first + count - 1
    if count <= 3:
        return sum(max(seconds(x), floor) for x in range(first, last + 1))
    points = [(float(x), seconds(x)) for x in (first, (first + last) // 2, last)]
    (x0, y0), (x1, y1), (x2, y2) = points
    # Newton's divided differences, then the monomial coefficients.
    d01, d12 = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
    c2 = (d12 - d01) / (x2 - x0)
    c1 = d01 - c2 * (x0 + x1)
    coefficients = (y0 - c1 * x0 - c2 * x0 * x0, c1, c2)

    def at(x: int) -> float:
        return coefficients[0] + coefficients[1] * x + coefficients[2] * x * x

    above = last + 1 if at(last) < floor else smallest_fitting(first, last, lambda x: at(x) >= floor)
    return (above - first) * floor + _sum_of(coefficients, above, last)


def uncached_prompt_seconds(shape: ModelShape, recipe: Recipe, product: GpuProduct, *, gathers: float) -> float:
    """One prompt's G completions without a cache (fsdp): for each new token a forward of the G
    rows so far, P + t tokens for t = 0 .. C - 1, each at least `gathers` (its weight gathers)."""
    prompt, completion = row_lengths(recipe)

    def one(tokens: int) -> float:
        return forward_seconds(shape, rows_of(recipe, tokens), product, adapters=True)

    return summed_passes(one, prompt, max(1, completion), gathers)


def rollout_seconds(shape: ModelShape, recipe: Recipe, product: GpuProduct, *, mode: Mode, gpus: int) -> float:
    """One micro-batch's rollouts: batchSize prompts one after another, G completions each."""
    if mode == "fsdp":
        gathers = forward_gather_seconds(shape, recipe, product, mode=mode, gpus=gpus)
        one = uncached_prompt_seconds(shape, recipe, product, gathers=gathers)
    else:
        one = cached_prompt_seconds(shape, recipe, product, hops=hop_seconds(mode, gpus))
    return recipe.rows * one


def old_logp_seconds(shape: ModelShape, recipe: Recipe, product: GpuProduct, *, mode: Mode, gpus: int) -> float:
    """The forward of a micro-batch without gradients for the old log-probabilities, adapter on:
    only where one batch of rollouts serves several optimizer steps (numIterations > 1)."""
    if terms(recipe).num_iterations <= 1:
        return 0.0
    forward = forward_seconds(shape, recipe, product, adapters=True) + hop_seconds(mode, gpus)
    return max(forward, forward_gather_seconds(shape, recipe, product, mode=mode, gpus=gpus))


def estimate(
    shape: ModelShape, recipe: Recipe, product: GpuProduct, *, gpus: int, mode: Mode, epoch_tokens: int | None = None
) -> Speed:
    """The plan's speed: `speed.estimate`'s trained micro-batch, and for GRPO its share of the
    rollouts and of the old log-probabilities' forward (each batch of them serves numIterations
    optimizer steps). A GRPO epoch is counted in prompts, not tokens (`step.optimizer_steps`):
    its speed holds no epoch of tokens."""
    speed = trained_estimate(shape, recipe, product, gpus=gpus, mode=mode, epoch_tokens=epoch_tokens)
    if recipe.grpo is None:
        return speed
    rollouts = rollout_seconds(shape, recipe, product, mode=mode, gpus=gpus)
    old = old_logp_seconds(shape, recipe, product, mode=mode, gpus=gpus)
    iterations = recipe.grpo.num_iterations
    step = speed.step_seconds + (rollouts + old) / iterations
    return replace(
        speed,
        step_seconds=step,
        tokens_per_second=speed.tokens_per_second * speed.step_seconds / step,
        epoch_tokens=None,
        rollout_seconds=rollouts,
        old_logp_seconds=old,
        rollout_iterations=iterations,
    )

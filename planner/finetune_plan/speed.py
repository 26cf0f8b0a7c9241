"""Throughput: FLOPs per token over the GPU's FP32 peak times a calibrated utilisation, plus the
memory-bound NF4 dequantisation, plus (FSDP) the weight all-gathers when they outlast compute.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from . import calibration as cal
from .gpu_products import GpuProduct
from .memory import (
    Recipe,
    checkpoint_bytes_per_layer,
    full_layer_activation_bytes,
    inputs_offloaded,
    keeps_attention_matrix,
    layer_packed_bytes,
    offloaded_layers,
    quantised_bytes_per_param,
    recomputed_layers,
)
from .model_shape import ModelShape

Mode = Literal["device_map", "data_parallel", "fsdp", "cpu"]


@dataclass(frozen=True)
class Speed:
    flops_per_token: float
    tokens_per_second: float
    step_seconds: float  # one micro-batch on one GPU
    bound: Literal["compute", "communication"]
    epoch_tokens: int | None = None
    # Of step_seconds: the forwards without gradients (`no_grad_seconds`), DPO's reference ones and
    # the pair split's policy ones.
    reference_seconds: float = 0.0
    split_seconds: float = 0.0
    # GRPO (`grpo.timing`): one micro-batch's rollouts and its forward for the old
    # log-probabilities, whole; one batch of them serves `rollout_iterations` optimizer steps, so
    # step_seconds holds that share of them.
    rollout_seconds: float = 0.0
    old_logp_seconds: float = 0.0
    rollout_iterations: int = 1

    @property
    def longest_seconds(self) -> float:
        """One micro-batch with its rollouts and old forward whole, not shared out: the longest a
        micro-batch under way may still take (`step_seconds` for every method but GRPO)."""
        whole = self.rollout_seconds + self.old_logp_seconds
        return self.step_seconds + whole - whole / self.rollout_iterations

    @property
    def seconds_per_epoch(self) -> float | None:
        if self.epoch_tokens is None or self.tokens_per_second <= 0:
            return None
        return self.epoch_tokens / self.tokens_per_second


def layer_passes(shape: ModelShape, recipe: Recipe) -> int:
    """Passes of a decoder layer per micro-batch: forward and backward of every layer, plus the
    recomputed forward of each checkpointed one."""
    return 2 * shape.layers + recomputed_layers(shape, recipe)


def flops_per_token(shape: ModelShape, recipe: Recipe) -> float:
    """Frozen weights need no weight gradient: 2 FLOPs per weight per pass; the adapters train
    fully (2 per weight in each forward, recomputed ones too, 4 in the backward); attention as
    its kernel computes it (`attention_flops_per_token`); the head forward and backward, and
    forward again where the loss runs in chunks (`head_passes`)."""
    passes = layer_passes(shape, recipe)
    linear = 2 * shape.linear_params_per_layer * passes
    forwards = shape.layers + recomputed_layers(shape, recipe)
    lora = (2 * forwards + 4 * shape.layers) * shape.lora_params_per_layer(recipe.lora_r, recipe.lora_targets)
    head = 2 * head_passes(recipe) * shape.vocab * shape.hidden
    return float(linear + lora + head + attention_flops_per_token(shape, recipe))


def head_passes(recipe: Recipe) -> int:
    """Matmuls of the LM head per token: its forward and its input gradient, plus the forward once
    more where the loss runs in chunks, since each chunk's logits are recomputed in the backward
    instead of kept (`finetune_trainer/model/loss_head.py`). Planned without it, a 6-layer 8B-shaped
    slice that kept every layer with the loss in chunks measured 0.79 of its planned speed, and
    the same slice offloading four layers with a whole loss 0.86 (the `fit` points of
    bench/results/2026-12-05-h200-heldout-fit.json)."""
    chunked = 0 < recipe.loss_chunk_tokens < recipe.tokens
    return 3 if chunked else 2


def attention_flops_per_token(shape: ModelShape, recipe: Recipe) -> float:
    """A materialised matrix: the scores and their product over the whole sequence in every
    pass, twice in backward. The fused kernel: the causal half of them, the forward's two
    matmuls in each forward (recomputed ones too), the backward's five (the scores again, then
    four gradients)."""
    width = recipe.max_length * shape.attention_width
    if keeps_attention_matrix(recipe):
        return float(4 * width * (layer_passes(shape, recipe) + shape.layers))
    forwards = shape.layers + recomputed_layers(shape, recipe)
    return float(2 * width * forwards + 5 * width * shape.layers)


def attention_seconds(shape: ModelShape, recipe: Recipe, product: GpuProduct) -> float:
    """The fused kernel's time per micro-batch, at its own measured share of the FP32 peak (its
    FLOPs are in `flops_per_token`, which counts them at the matmuls' share: this is the rest)."""
    if keeps_attention_matrix(recipe):
        return 0.0
    flops = attention_flops_per_token(shape, recipe) * recipe.tokens
    peak = product.fp32_tflops * 1e12
    return flops / (peak * cal.FUSED_ATTENTION_UTILISATION) - flops / (peak * cal.COMPUTE_UTILISATION)


def memory_traffic_bytes(shape: ModelShape, recipe: Recipe) -> float:
    """Bytes moved per micro-batch by NF4 dequantisation: each pass reads every 4-bit linear and
    writes and re-reads its wide copy. (Elementwise traffic is left to the fitted constants: the
    calibration grid fits better without a separate term for it.)"""
    if recipe.quantization == "none":
        return 0.0
    per_param = quantised_bytes_per_param(recipe) + 2 * recipe.compute_bytes
    return layer_passes(shape, recipe) * shape.linear_params_per_layer * per_param


def adapter_seconds(shape: ModelShape, recipe: Recipe, product: GpuProduct, *, backward: bool = True) -> float:
    """The adapters' own work per micro-batch beyond their matmuls' FLOPs: memory traffic. A LoRA
    adapter's matmuls are skinny (r columns against thousands), so its cost is the tensors it
    reads and writes: in the forward its input once (the A matmul) and its output width several
    times (the B matmul's output, the scaling, the sum into the frozen linear's output and PEFT's
    copy of that output for 4-bit linears); in the backward the input's gradient and the output's;
    with dropout the dropped copy of the input and its mask, each way. Floats per token per width,
    measured apart on PEFT's LoRA layer over bitsandbytes' NF4 linear (`bench.calibration.lora_cost`).
    Without it, rank 16-64 on all seven linears at 3072-4096 tokens ran 8-13 % below the plan
    (bench/results/2026-12-05-h200-heldout-heldout-*.json). `backward=False`: one forward of one
    layer, for `layer_forward_seconds`."""
    dims = shape.linear_dims()
    adapted = [dims[t] for t in recipe.lora_targets if t in dims]
    if not adapted:
        return 0.0
    drop = 1.0 if recipe.lora_dropout else 0.0

    def floats(per_in: float, per_out: float, per_dropped: float) -> float:
        return sum(per_in * fan_in + per_out * fan_out + per_dropped * drop * fan_in for fan_in, fan_out in adapted)

    forward = floats(cal.ADAPTER_FORWARD_IN_FLOATS, cal.ADAPTER_FORWARD_OUT_FLOATS, cal.ADAPTER_FORWARD_DROPOUT_FLOATS)
    per_float = recipe.tokens * recipe.compute_bytes / (product.memory_gbps * 1e9 * cal.BANDWIDTH_UTILISATION)
    if not backward:
        return forward * per_float
    back = floats(cal.ADAPTER_BACKWARD_IN_FLOATS, cal.ADAPTER_BACKWARD_OUT_FLOATS, cal.ADAPTER_BACKWARD_DROPOUT_FLOATS)
    forwards = shape.layers + recomputed_layers(shape, recipe)
    return (forwards * forward + shape.layers * back) * per_float


def layer_forward_seconds(shape: ModelShape, recipe: Recipe, product: GpuProduct, *, adapters: bool = True) -> float:
    """One decoder layer's forward over one pass's tokens: its matmuls, its dequantisation, its
    launches, and the adapters' traffic (`adapters` False: a LoRA layer switched off runs its base
    layer alone)."""
    one = replace(recipe, gradient_checkpointing=False, offload=False)
    layer = replace(shape, layers=1)
    width = recipe.max_length * layer.attention_width
    matrix = keeps_attention_matrix(one)
    peak = product.fp32_tflops * 1e12
    flops = 2 * layer.linear_params_per_layer + (4 * width if matrix else 0)
    compute = flops * recipe.tokens / (peak * cal.COMPUTE_UTILISATION)
    compute += 0.0 if matrix else 2 * width * recipe.tokens / (peak * cal.FUSED_ATTENTION_UTILISATION)
    memory = memory_traffic_bytes(layer, one) / 2 / (product.memory_gbps * 1e9 * cal.BANDWIDTH_UTILISATION)
    lora = adapter_seconds(layer, one, product, backward=False) if adapters else 0.0
    return compute + memory + lora + cal.LAYER_PASS_SECONDS


def forward_flops_per_token(shape: ModelShape, recipe: Recipe, *, adapters: bool) -> float:
    """A forward without gradients: every frozen weight once, the adapters' matmuls where they
    are on, attention's forward and the LM head once (no chunk is recomputed: nothing goes back)."""
    width = recipe.max_length * shape.attention_width
    attention = (4 if keeps_attention_matrix(recipe) else 2) * width
    lora = 2 * shape.lora_params_per_layer(recipe.lora_r, recipe.lora_targets) if adapters else 0
    return float(shape.layers * (2 * shape.linear_params_per_layer + lora + attention) + 2 * shape.vocab * shape.hidden)


def forward_seconds(shape: ModelShape, recipe: Recipe, product: GpuProduct, *, adapters: bool) -> float:
    """One forward without gradients over one pass's tokens: every layer's forward (no recompute,
    no activations kept, no backward), the adapters' matmuls where on, and the LM head once."""
    peak = product.fp32_tflops * 1e12 * cal.COMPUTE_UTILISATION
    lora = 2 * shape.lora_params_per_layer(recipe.lora_r, recipe.lora_targets) if adapters else 0
    extra = (shape.layers * lora + 2 * shape.vocab * shape.hidden) * recipe.tokens / peak
    return shape.layers * layer_forward_seconds(shape, recipe, product, adapters=adapters) + extra


def reference_seconds(shape: ModelShape, recipe: Recipe, product: GpuProduct) -> float:
    """A micro-batch's reference forwards (DPO: each sequence once more through the model with
    its adapters off, without gradients), in as many passes as the trained forwards."""
    if not recipe.reference_forwards:
        return 0.0
    one = forward_seconds(shape, recipe, product, adapters=False)
    return recipe.reference_forwards * recipe.grad_passes * one


def split_seconds(shape: ModelShape, recipe: Recipe, product: GpuProduct) -> float:
    """The pair split's forwards without gradients: each side once through the trained model
    before its forward with gradients, since a pair's loss needs both sides first (`pairs`)."""
    if not recipe.pair_split:
        return 0.0
    return recipe.grad_passes * forward_seconds(shape, recipe, product, adapters=True)


def offload_stall_seconds(shape: ModelShape, recipe: Recipe, product: GpuProduct) -> float:
    """What offloading adds to a micro-batch: each offloaded layer's activations cross the host
    link twice (out in the forward, back in the backward), hidden under the compute of the layer
    they overlap with (the next forward; the backward, about twice a forward) where they are shorter.
    The backward fetches a layer back when it reaches the layer after it (`finetune_trainer.memory.
    activations.Offloader.reached`), so the first offloaded layer it reaches, behind the kept ones,
    has nothing to hide its fetch: the backward waits for it whole. Planned without that wait,
    every held-out run that offloaded measured 3-6 % below the same point's runs that did not
    (bench/results/2026-12-05-h200-heldout-heldout-*.json)."""
    count = offloaded_layers(shape, recipe)
    moved = full_layer_activation_bytes(shape, recipe) / (product.host_link_gbps * 1e9)
    if inputs_offloaded(recipe):  # only a recomputing layer's input crosses
        count = recomputed_layers(shape, recipe)
        moved = checkpoint_bytes_per_layer(shape, recipe) / (product.host_link_gbps * 1e9)
    if not count:
        return 0.0
    forward = layer_forward_seconds(shape, recipe, product)
    return count * (max(0.0, moved - forward) + max(0.0, moved - 2 * forward)) + moved


def compute_seconds(shape: ModelShape, recipe: Recipe, product: GpuProduct) -> float:
    """One micro-batch: each forward and backward (one, or one per side of a split pair), the
    step's share, and the forwards without gradients (`reference_seconds`, `split_seconds`)."""
    flops = flops_per_token(shape, recipe) * recipe.tokens
    compute = flops / (product.fp32_tflops * 1e12 * cal.COMPUTE_UTILISATION)
    memory = memory_traffic_bytes(shape, recipe) / (product.memory_gbps * 1e9 * cal.BANDWIDTH_UTILISATION)
    launches = layer_passes(shape, recipe) * cal.LAYER_PASS_SECONDS
    attention = attention_seconds(shape, recipe, product)
    adapters = adapter_seconds(shape, recipe, product)
    # The optimizer's step and the trainer's own work once per step (the figures it reports, the
    # gradient clip, the step's bookkeeping), shared by the step's micro-batches.
    step = cal.STEP_SECONDS / recipe.gradient_accumulation
    stall = offload_stall_seconds(shape, recipe, product)
    passes = recipe.grad_passes
    trained = (compute + memory + adapters + launches + attention) * passes + step + stall * passes
    return trained + reference_seconds(shape, recipe, product) + split_seconds(shape, recipe, product)


def gather_bytes(shape: ModelShape, recipe: Recipe, gpus: int) -> float:
    """FSDP: bytes each GPU receives per micro-batch. Every layer is gathered twice (forward;
    backward, whose recompute runs inside the same gather), the embedding once and the FP32
    head twice (forward and backward), in each trained pass; the adapters' gathers and gradient
    reduce-scatters are too small to count. A tied matrix stays whole in the root: gathered once."""
    if gpus <= 1:
        return 0.0
    share = (gpus - 1) / gpus
    layers = shape.layers * layer_packed_bytes(shape, recipe)
    embedding, head = shape.embedding_params * recipe.compute_bytes, shape.head_params * 4
    trained = 2 * layers + (embedding + 2 * head)
    # Each forward without gradients (`no_grad_forwards`) gathers every layer and the head once more.
    forwards = no_grad_forwards(recipe) * (layers + embedding + head)
    return share * recipe.grad_passes * (trained + forwards)


def no_grad_forwards(recipe: Recipe) -> int:
    """Forwards of each sequence without gradients: the reference's, and the split pair's one."""
    return recipe.reference_forwards + (1 if recipe.pair_split else 0)


def estimate(
    shape: ModelShape, recipe: Recipe, product: GpuProduct, *, gpus: int, mode: Mode, epoch_tokens: int | None = None
) -> Speed:
    step = compute_seconds(shape, recipe, product)
    bound: Literal["compute", "communication"] = "compute"
    passes = recipe.grad_passes
    parallel = 1
    if mode == "data_parallel":
        parallel = gpus
    elif mode == "fsdp":
        parallel = gpus
        comm = gather_bytes(shape, recipe, gpus) / (product.link_gbps * 1e9 * cal.BANDWIDTH_UTILISATION)
        if comm > step:  # gathers overlap compute; the longer of the two sets the pace
            step, bound = comm, "communication"
    if mode == "device_map":
        # The layers run one GPU after another (N GPUs give one GPU's speed), plus a hand-over
        # of the hidden states at each boundary.
        step += (gpus - 1) * cal.DEVICE_HOP_SECONDS * passes
    # Per token trained: the trained passes' FLOPs and the forwards' without gradients.
    reference = recipe.reference_forwards * forward_flops_per_token(shape, recipe, adapters=False)
    split = forward_flops_per_token(shape, recipe, adapters=True) if recipe.pair_split else 0.0
    return Speed(
        flops_per_token=flops_per_token(shape, recipe) + reference + split,
        tokens_per_second=parallel * recipe.micro_tokens / step,
        step_seconds=step,
        bound=bound,
        epoch_tokens=epoch_tokens,
        reference_seconds=reference_seconds(shape, recipe, product),
        split_seconds=split_seconds(shape, recipe, product),
    )

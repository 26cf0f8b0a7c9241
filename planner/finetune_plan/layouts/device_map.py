"""deviceMap: one process, the decoder layers in contiguous blocks over the GPUs.

GPU 0 also holds the embeddings, the last GPU the final norm, the head and the loss (a tied head
stays with the embeddings on GPU 0); only one GPU computes at a time. The blocks are balanced
(`placement.balance`) as if every layer recomputed, and accelerate is handed the placement both
as an explicit device_map and as its max_memory budget (`loading_budget`). One GPU of any mode
is this layout with one block (`mode.layout_for`).
"""

from __future__ import annotations

from dataclasses import replace

from .. import memory as mem
from ..grpo.phases import no_grad_bytes
from ..memory import GpuMemory, Recipe
from ..model_shape import ModelShape
from ..placement import QUANTISED_ACCOUNTING_BYTES, Placement, balance, max_memory
from ..results.layout import Hardware, Layout


def device_map_gpu(
    shape: ModelShape,
    recipe: Recipe,
    hw: Hardware,
    gpu: int,
    layers: int,
    *,
    first: int | None = None,
    cached: bool = True,
) -> GpuMemory:
    """GPU `gpu` holding `layers` decoder layers from index `first` (default: the last ones on the
    last GPU, else the first ones: where the kept layers would be without a placement); GRPO's
    rollouts with a KV cache, or without one (`cached` False: fsdp's lockstep on one GPU)."""
    last = hw.gpus - 1
    if first is None:
        first = shape.layers - layers if gpu == last else 0
    kept = mem.kept_on_gpu(shape, recipe, first, layers)
    offloaded = mem.offloaded_on_gpu(shape, recipe, first, layers)
    # A tied head is the embedding matrix: accelerate keeps it with the embeddings on GPU 0.
    loss_gpu = 0 if shape.tied_embeddings else last
    embeddings_head = (mem.embedding_bytes(shape, recipe) if gpu == 0 else 0.0) + (
        mem.head_bytes(shape) if gpu == loss_gpu else 0.0
    )
    outside = mem.outside_layers_activation_bytes(shape, recipe) if gpu == loss_gpu else 0.0
    # The mask is built on GPU 0; each layer on a later GPU gets (and keeps) its own copy there.
    outside += mem.attention_mask_bytes(recipe) * (1 if gpu == 0 else layers)
    return GpuMemory(
        index=gpu,
        layers=layers,
        quantised_weights=layers * mem.layer_weight_bytes(shape, recipe),
        embeddings_head=embeddings_head,
        norms=layers * mem.norm_bytes_per_layer(shape) + (shape.hidden * mem.FP32 if gpu == last else 0.0),
        lora_optimizer=layers * mem.lora_state_bytes_per_layer(shape, recipe),
        activations=mem.activations_on_gpu(shape, recipe, layers, kept, offloaded) + outside,
        temporaries=mem.layer_pass_temporaries(shape, recipe, layers, kept, offloaded),
        logits=mem.logits_bytes(shape, recipe) if gpu == loss_gpu else 0.0,
        capacity=hw.capacity,
        workspaces=mem.cublas_workspace_bytes(hw.product),
        rollouts=no_grad_bytes(shape, recipe, layers=layers, head=gpu == loss_gpu, cached=cached),
    )


def device_map_layout(
    shape: ModelShape, recipe: Recipe, hw: Hardware, placement: Placement | None = None, *, cached: bool = True
) -> Layout:
    """device_map memory per GPU, for the balanced placement or a given one (`cached`: as
    `device_map_gpu`)."""

    # Balanced as if every layer recomputed: the layers kept (the last) then add to the GPUs that
    # hold them, which `gradientCheckpointing: auto` sizes against each GPU's headroom.
    even = replace(recipe, kept_layers=0)

    def total_for(gpu: int, count: int) -> float:
        return device_map_gpu(shape, even, hw, gpu, count).total

    if placement is None:
        placement = balance(shape.layers, [hw.capacity] * hw.gpus, total_for)
    firsts = [sum(placement.layers_per_gpu[:gpu]) for gpu in range(len(placement.layers_per_gpu))]
    per_gpu = tuple(
        device_map_gpu(shape, recipe, hw, gpu, count, first=firsts[gpu], cached=cached)
        for gpu, count in enumerate(placement.layers_per_gpu)
    )
    return Layout("device_map", per_gpu, recipe.loss_chunk_tokens, placement)


def loading_budget(shape: ModelShape, recipe: Recipe, layout: Layout) -> dict[int, int] | None:
    """accelerate's max_memory per GPU for the placement (None without one)."""
    if layout.placement is None:
        return None
    accounting = shape.linear_params_per_layer * (
        QUANTISED_ACCOUNTING_BYTES if recipe.quantization != "none" else recipe.compute_bytes
    )
    return max_memory(layout.placement, accounting, mem.embedding_bytes(shape, recipe), mem.head_bytes(shape))

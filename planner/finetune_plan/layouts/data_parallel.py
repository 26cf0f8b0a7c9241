"""dataParallel: one process per GPU, each with a whole NF4 copy and its own micro-batches.

Each rank keeps the adapter whole and sums its gradients with the other ranks' in one flat
buffer; otherwise a rank holds what one GPU of deviceMap holds with every layer.
"""

from __future__ import annotations

from dataclasses import replace

from .. import memory as mem
from ..memory import Recipe
from ..model_shape import ModelShape
from ..results.layout import Hardware, Layout
from .device_map import device_map_gpu


def data_parallel_layout(shape: ModelShape, recipe: Recipe, hw: Hardware) -> Layout:
    """Every GPU the whole model, as one GPU of deviceMap holds it, plus the flat buffer of the
    adapter gradients' sum."""
    one = device_map_gpu(shape, recipe, hw.with_gpus(1), 0, shape.layers)
    one = replace(one, lora_optimizer=one.lora_optimizer + mem.adapter_gradient_sum_bytes(shape, recipe))
    return Layout("data_parallel", tuple(replace(one, index=i) for i in range(hw.gpus)), recipe.loss_chunk_tokens)

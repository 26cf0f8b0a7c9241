"""What one trainer process holds on the host at its peak, the load, before anything is pinned.

Each process holds the same base (Python, torch, CUDA's host libraries, the tokenizer and the
dataset's rows) and what its loader stages on the host. Every loader goes to the GPUs a tensor at
a time, so the most it stages is the largest tensor in fp32 (the embedding matrix of a large
vocabulary); fsdp on a checkpoint it cannot stream holds the whole packed model until it is
sharded. The checkpoint's files are read through the page cache, which the kernel reclaims under
the pod's limit and is not counted.
"""

from __future__ import annotations

from typing import Final

from ..memory import FP32, GIB, Recipe, embedding_bytes, head_bytes, layer_weight_bytes, norm_bytes_per_layer
from ..model_shape import ModelShape

# Python, torch, CUDA's host libraries and the tokenizer: what a trainer process holds on the host
# before the model (about 1.3 GiB measured on the 40-layer fsdp bench run; rounded up).
PROCESS_HOST_BASE_BYTES: Final = 1.5 * GIB


def host_model_bytes(shape: ModelShape, recipe: Recipe) -> float:
    """The whole quantised model on the host, as fsdp loads it before sharding: every layer's
    packed weights and quantisation state, the fp32 embeddings, head and norms."""
    return (
        shape.layers * (layer_weight_bytes(shape, recipe) + norm_bytes_per_layer(shape))
        + embedding_bytes(shape, recipe)
        + head_bytes(shape)
    )


def host_bytes_per_process(shape: ModelShape) -> float:
    """One trainer process's host memory at its peak, the load. Every loader goes to the GPUs a
    tensor at a time and stages at most the largest tensor in fp32: single, dataParallel and
    deviceMap through from_pretrained, fsdp by streaming its safetensors (`modes.streaming`;
    0.59 GiB of anonymous memory on a 16-layer 70B-shaped slice against 15.79 before,
    bench/results/2026-12-01-h200-1gpu-16l-streamed.json)."""
    largest = max(shape.embedding_params, shape.head_params, shape.largest_linear_params)
    return largest * FP32 + PROCESS_HOST_BASE_BYTES


def whole_load_host_bytes_per_process(shape: ModelShape, recipe: Recipe) -> float:
    """fsdp's host memory per process when a checkpoint cannot be streamed (no safetensors
    files): the whole packed model, as the loader before streaming held it."""
    return host_model_bytes(shape, recipe) + PROCESS_HOST_BASE_BYTES

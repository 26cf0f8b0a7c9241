"""Pinned host memory: what a process pins for the activations it moves off the GPU.

An offloaded layer's saved tensors (`activationOffload`), or a recomputing layer's input where
the GPUs need the room (`Recipe.offload_inputs`), wait in pinned host memory for the backward.
PyTorch's pinned allocator rounds every block up to a power of two, so the figure is counted per
storage (`memory.saved_storages`) as that allocator rounds it, not as the bytes saved.
"""

from __future__ import annotations

import math

from ..memory import (
    Recipe,
    checkpoint_bytes_per_layer,
    inputs_offloaded,
    offloaded_layers,
    recomputed_layers,
    saved_storages,
)
from ..model_shape import ModelShape


def pinned_block(nbytes: float) -> float:
    """What PyTorch's pinned host allocator holds for a request: the next power of two (it rounds
    every block up, so blocks are reused across sizes). Counted per storage, it is what the
    trainer's offload pinned on the GPU: a 13B-shaped layer at 4096 tokens saves 1.95 GiB and pins
    2.75 (5 layers: 13.75 GiB planned per storage, 13.59 measured, 9.76 counted as the bytes
    saved; bench/results/2026-12-05-h200-heldout-heldout-a.json)."""
    if nbytes <= 0:
        return 0.0
    return float(2 ** math.ceil(math.log2(nbytes)))


def pinned_layer_bytes(shape: ModelShape, recipe: Recipe) -> float:
    """Pinned host memory of one offloaded layer's saved tensors, per storage as the allocator rounds."""
    return sum(pinned_block(b) for b in saved_storages(shape, recipe))


def offload_host_bytes(shape: ModelShape, recipe: Recipe) -> float:
    """Pinned host memory one process holds for its offloaded layers' activations, or for its
    recomputing layers' inputs (`offload_inputs`), each storage rounded as the pinned allocator
    rounds it (`pinned_block`)."""
    if inputs_offloaded(recipe):
        return recomputed_layers(shape, recipe) * pinned_block(checkpoint_bytes_per_layer(shape, recipe))
    return offloaded_layers(shape, recipe) * pinned_layer_bytes(shape, recipe)

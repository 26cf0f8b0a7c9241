"""The layout of a mode on the pod's GPUs: the one door the search and the sizing go through.

On one GPU every mode is one process holding the whole model, whatever it is called: FSDP over
one rank switches itself to NO_SHARD, and data-parallel of one has nothing to average. So one
GPU is laid out as deviceMap's single block, under the mode's name.
"""

from __future__ import annotations

from dataclasses import replace

from ..memory import Recipe
from ..model_shape import ModelShape
from ..results.layout import Hardware, Layout
from ..speed import Mode
from .data_parallel import data_parallel_layout
from .device_map import device_map_layout
from .fsdp import fsdp_layout


def layout_for(mode: Mode, shape: ModelShape, recipe: Recipe, hw: Hardware) -> Layout:
    """`mode`'s memory on every GPU of `hw`."""
    if hw.gpus == 1:
        # fsdp's ranks generate GRPO's rollouts in lockstep without a KV cache, on one GPU too.
        return replace(device_map_layout(shape, recipe, hw, cached=mode != "fsdp"), mode=mode)
    if mode == "device_map":
        return device_map_layout(shape, recipe, hw)
    if mode == "data_parallel":
        return data_parallel_layout(shape, recipe, hw)
    return fsdp_layout(shape, recipe, hw)

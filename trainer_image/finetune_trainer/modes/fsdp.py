"""fsdp (FSDP-QLoRA): the frozen NF4 base sharded over the ranks, the LoRA adapter whole on each.

Loading, streamed (`streaming`): the model built on the meta device, then each unit read from
the checkpoint's files, quantised on the ranks' GPUs (each tensor by one rank, then broadcast) and
sharded by `shard` at once, unit by unit: neither a GPU nor the host holds the model. A checkpoint
that cannot be streamed (no safetensors files, tensors transformers converts on load) loads as
before: on the host with float32 quant storage, each weight quantised on the rank's GPU on its way
(`gpu_quantise`), then sharded to the GPUs unit by unit.
Every rank runs every forward (a masked row past the data's end): the shards' all-gathers are
collectives. The checkpoint holds the adapter and its optimizer state, whole on each rank.

FSDP1 (torch 2.7's safe choice with bitsandbytes' Params4bit), FULL_SHARD, one unit per
decoder layer, plus one each for the input embeddings and the LM head when they are not tied
(in the root unit they would stay gathered, whole and fp32, for the entire step).
FSDP flattens only tensors of one float dtype per unit: the NF4 weights are therefore stored
as float32 (`bnb_4bit_quant_storage`), the same bytes as uint8 storage, and no
MixedPrecision is set (a param dtype unlike the storage's would cast the packed weights into
garbage). The quantisation state is not a parameter; bitsandbytes restores it from the module
on each forward.

The adapter is left out of FSDP (`ignored_states`): it is a few MB, so each rank keeps it whole,
its gradients are summed by `gradsync` exactly as in dataParallel, and its optimizer state is
the same on every rank: a checkpoint written by any process count resumes on any other.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..distributed.topology import Topology
from ..hardware.capabilities import Hardware
from ..memory.budget import MemoryPlan
from .base import Mode, Placement


def _layer_classes(model: nn.Module) -> tuple[type[nn.Module], ...]:
    """The decoder layer class(es), found by transformers' own list or by the `layers` list."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    base = getattr(model, "get_base_model", lambda: model)()
    names |= set(getattr(base, "_no_split_modules", None) or ())
    found = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not found:
        for module in model.modules():
            layers = getattr(module, "layers", None)
            if isinstance(layers, nn.ModuleList) and len(layers):
                found.add(type(layers[0]))
                break
    if not found:
        raise ValueError("cannot find the model's decoder layers to shard")
    return tuple(found)


def shard(
    model: nn.Module,
    trainable: Sequence[nn.Parameter],
    topology: Topology,
    on_gpu: bool,
    param_init_fn: Callable[[nn.Module], None] | None = None,
) -> nn.Module:
    """Wrap `model` (a PEFT model whose only trainable params are `trainable`) in FSDP; a meta
    model's units are made by `param_init_fn` as FSDP reaches each."""
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

    base: Any = getattr(model, "get_base_model", lambda: model)()
    embed: Any = base.get_input_embeddings()
    head: Any = base.get_output_embeddings()
    tied = head is not None and embed is not None and head.weight is embed.weight
    layers = _layer_classes(model)
    own_units: list[nn.Module] = [] if tied else [m for m in (embed, head) if m is not None]

    def wrap(module: nn.Module) -> bool:
        return isinstance(module, layers) or any(module is unit for unit in own_units)

    device = topology.device(on_gpu)
    if on_gpu:
        # The adapter stays outside FSDP, so FSDP will not move it: put it on the rank's GPU.
        for param in trainable:
            param.data = param.data.to(device)
    return FSDP(
        model,
        auto_wrap_policy=functools.partial(lambda_auto_wrap_policy, lambda_fn=wrap),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        use_orig_params=True,
        ignored_states=list(trainable),
        device_id=device,  # on the CPU too: FSDP otherwise looks for an accelerator
        sync_module_states=False,  # every rank loaded (or was sent) the same weights
        param_init_fn=param_init_fn,
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
        limit_all_gathers=True,
    )


class Fsdp(Mode):
    """More than one process (one process trains as `SingleProcess`)."""

    sharded = True
    # FSDP flattens one float dtype per unit: pack the 4-bit weights into float32.
    quant_storage = torch.float32
    loads_on_host = True
    streams = True

    def device_map(self, hardware: Hardware, plan: MemoryPlan, device: torch.device) -> Placement:
        return {"": "cpu"}

    def quantise_on(self, hardware: Hardware, device: torch.device) -> torch.device:
        # Loaded on the host; its weights are quantised on this rank's GPU, one at a time.
        return device if hardware.on_gpu else torch.device("cpu")

    def wrap(self, model: nn.Module, trainable: Sequence[nn.Parameter], ranks: Topology, on_gpu: bool) -> nn.Module:
        stream = self.stream
        if stream is None:
            return shard(model, trainable, ranks, on_gpu)
        try:
            return shard(model, trainable, ranks, on_gpu, param_init_fn=stream.materialise)
        finally:
            self.bytes_read = stream.files.bytes_read
            stream.close()
            self.stream = None

"""Where each decoder layer's activations live between its forward and its backward.

The plan (`finetune_plan.recompute`) says how many layers keep their activations on the GPU; the
trainer keeps the model's last ones (the backward runs them first and frees what they kept before
the first recompute, as the plan counts it). Every other layer is either checkpointed (its forward
runs again in the backward) or, with `training.activationOffload`, keeps its saved tensors in
pinned host memory instead (`Offload`).

transformers 5 makes every decoder layer a `GradientCheckpointingLayer`: enabling checkpointing
sets `gradient_checkpointing = True` on each, and each layer's `forward` checks its own flag, so
turning the flag off on a layer keeps that layer's activations. The flag sits on the layer itself,
under PEFT (which wraps only the linears) and under FSDP (which wraps the layer and calls it).

None of this changes the math: a recomputed forward restores the layer's RNG state, an offloaded
tensor comes back bit for bit.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import torch
from torch import nn

from finetune_api.spec import FineTuneJobSpec

from . import test_hooks

log = logging.getLogger(__name__)

# Smaller saved tensors stay where they are: their copy costs more than the memory it frees.
MIN_OFFLOAD_BYTES: Final = 64 * 1024


@dataclass(frozen=True)
class LayerActivations:
    """`kept` decoder layers (the last) keep their activations; the rest recompute, or with
    `offload` wait in host memory."""

    kept: int
    offload: bool

    def recomputed(self, layers: int) -> int:
        return 0 if self.offload else layers - min(self.kept, layers)


def chosen(spec: FineTuneJobSpec, summary: Mapping[str, Any], layers: int) -> LayerActivations:
    """The plan's choice (GPU runs), or on the CPU, which no plan sizes, the spec's: true
    recomputes every layer, false none, auto none either (no GPU memory to fill) unless a test
    names how many to keep (`test_hooks.KEEP_LAYERS`)."""
    if "kept_layers" in summary:
        return LayerActivations(int(summary["kept_layers"]), int(summary.get("offloaded_layers") or 0) > 0)
    asked = spec.training.gradient_checkpointing
    if asked is False:
        return LayerActivations(layers, False)
    offload = spec.training.activation_offload is True
    if asked is True:
        return LayerActivations(0, offload)
    kept = test_hooks.keep_layers()
    return LayerActivations(layers if kept is None else min(kept, layers), offload)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's decoder layers, in order: the modules transformers checkpoints one by one."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def apply(model: nn.Module, layout: LayerActivations) -> dict[str, int]:
    """Turn checkpointing off on the kept layers (checkpointing already enabled on all when any
    recomputes) and hook offloading on the others when asked; returns the counts for the log."""
    layers = decoder_layers(model)
    kept_from = len(layers) - min(layout.kept, len(layers))
    offloaded = 0
    for index, layer in enumerate(layers):
        if index >= kept_from or layout.offload:
            layer.gradient_checkpointing = False  # type: ignore[assignment]
        if index < kept_from and layout.offload:
            Offload.attach(layer)
            offloaded += 1
    counts = {
        "layers": len(layers),
        "kept": len(layers) - kept_from,
        "recomputed": sum(1 for m in layers if getattr(m, "gradient_checkpointing", False)),
        "offloaded": offloaded,
    }
    log.info("activations: %s", counts)
    return counts


class Offload:
    """Saved tensors of one layer's forward to host memory, back when the backward needs them.

    On a GPU the copy out runs on a side stream after the work that made the tensor (the tensor
    is marked used by that stream, so the allocator reuses its memory only once the copy is done)
    into pinned memory; the copy back waits for it and runs on the backward's stream. On the CPU
    the "host copy" is a copy, which keeps the hook's math tested where no GPU is."""

    _stream: torch.cuda.Stream | None = None

    @classmethod
    def side_stream(cls) -> torch.cuda.Stream:
        if cls._stream is None:
            cls._stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        return cls._stream

    @staticmethod
    def pack(tensor: torch.Tensor) -> Any:
        if (
            isinstance(tensor, nn.Parameter)
            or tensor.numel() * tensor.element_size() < MIN_OFFLOAD_BYTES
            or not tensor.is_contiguous()
        ):
            return tensor
        if tensor.device.type != "cuda":
            return (tensor.detach().clone(), tensor.device, None)
        stream = Offload.side_stream()
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        with torch.cuda.stream(stream):
            host.copy_(tensor, non_blocking=True)
        tensor.record_stream(stream)
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        done.record(stream)  # type: ignore[no-untyped-call]
        return (host, tensor.device, done)

    @staticmethod
    def unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        host, device, done = packed
        if done is None:
            return host  # type: ignore[no-any-return]
        torch.cuda.current_stream(device).wait_event(done)
        return host.to(device, non_blocking=True)  # type: ignore[no-any-return]

    @classmethod
    def attach(cls, layer: nn.Module) -> None:
        """Every forward of `layer` with gradients runs under the offloading hooks."""
        entered: list[torch.autograd.graph.saved_tensors_hooks] = []

        def enter(module: nn.Module, args: Any) -> None:
            if torch.is_grad_enabled() and module.training:
                hooks = torch.autograd.graph.saved_tensors_hooks(cls.pack, cls.unpack)
                hooks.__enter__()
                entered.append(hooks)

        def leave(module: nn.Module, args: Any, output: Any) -> None:
            if entered:
                entered.pop().__exit__(None, None, None)

        layer.register_forward_pre_hook(enter)
        layer.register_forward_hook(leave)

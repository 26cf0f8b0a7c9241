"""Where each decoder layer's activations live between its forward and its backward.

The plan (`finetune_plan.recompute`) says how many layers keep their activations on the GPU; the
trainer keeps the model's last ones (the backward runs them first and frees what they kept before
the first recompute, as the plan counts it). Every other layer is either checkpointed (its forward
runs again in the backward) or, with `training.activationOffload`, keeps its saved tensors in
pinned host memory instead (`Offloader`), brought back ahead of the backward. Where the pod's host
memory holds only some of them, the plan offloads the layers just before the kept ones and the
first ones recompute.

transformers 5 makes every decoder layer a `GradientCheckpointingLayer`: enabling checkpointing
sets `gradient_checkpointing = True` on each, and each layer's `forward` checks its own flag, so
turning the flag off on a layer keeps that layer's activations. The flag sits on the layer itself,
under PEFT (which wraps only the linears) and under FSDP (which wraps the layer and calls it).

None of this changes the math: a recomputed forward restores the layer's RNG state, an offloaded
tensor comes back bit for bit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final

import torch
from torch import nn

from finetune_api.spec import FineTuneJobSpec
from finetune_plan import ActivationAsk, LayerLayout

log = logging.getLogger(__name__)

# Smaller saved tensors stay where they are: their copy costs more than the memory it frees.
MIN_OFFLOAD_BYTES: Final = 64 * 1024


@dataclass(frozen=True)
class LayerActivations:
    """`kept` decoder layers (the last) keep their activations; the rest recompute, or with
    `offload` wait in host memory (`offloaded` of them, those just before the kept ones; None:
    all)."""

    kept: int
    offload: bool
    # The recomputing layers' inputs wait in pinned host memory until their recompute.
    inputs: bool = False
    offloaded: int | None = None

    def offloaded_from(self, layers: int) -> int:
        """The first offloaded layer's index (the first kept one's when none offloads)."""
        kept_from = layers - min(self.kept, layers)
        if not self.offload:
            return kept_from
        return kept_from - (kept_from if self.offloaded is None else min(self.offloaded, kept_from))

    def recomputed(self, layers: int) -> int:
        return self.offloaded_from(layers)


def chosen(spec: FineTuneJobSpec, planned: LayerLayout | None, layers: int) -> LayerActivations:
    """The plan's choice (GPU runs), or on the CPU, which no plan sizes, the spec's: true
    recomputes every layer, false none, auto none either (no GPU memory to fill) unless
    `training.keptLayers` names how many keep; `activationOffload: inputs` puts the recomputing
    layers' inputs in host memory."""
    if planned is not None:
        offloaded = planned.offloaded
        return LayerActivations(planned.kept, offloaded > 0, planned.inputs_offloaded, offloaded or None)
    asked = ActivationAsk.of(spec.training)
    if not asked.recomputes:
        return LayerActivations(layers, False)
    offload = asked.offloads
    inputs = asked.inputs
    if asked.recomputes_all:
        return LayerActivations(0, offload, inputs)
    kept = asked.kept
    return LayerActivations(layers if kept is None else min(kept, layers), offload, inputs)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's decoder layers, in order: the modules transformers checkpoints one by one."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def apply(model: nn.Module, layout: LayerActivations) -> dict[str, int]:
    """Turn checkpointing off on the kept layers (checkpointing already enabled on all when any
    recomputes) and hook offloading on the others when asked; returns the counts for the log."""
    layers = decoder_layers(model)
    kept_from = len(layers) - min(layout.kept, len(layers))
    offloaded_from = layout.offloaded_from(len(layers))
    offloaded = 0
    offloader = Offloader()
    for index, layer in enumerate(layers):
        if index >= offloaded_from:
            # nn.Module's __setattr__ is typed for tensors and modules; this is transformers' flag on its decoder layer.
            layer.gradient_checkpointing = False  # type: ignore[assignment]
        if offloaded_from <= index < kept_from or (index < kept_from and layout.inputs and not layout.offload):
            # A recomputing layer's hooks run outside its checkpoint (transformers checkpoints
            # `forward`, not `__call__`): under them autograd saves only what the checkpoint keeps,
            # the layer's input, so that is all that crosses; the layer's own saved tensors stay
            # the checkpoint's, dropped and recomputed.
            offloader.attach(layer, first=offloaded == 0)
            offloaded += 1
    counts = {
        "layers": len(layers),
        "kept": len(layers) - kept_from,
        "recomputed": sum(1 for m in layers if getattr(m, "gradient_checkpointing", False)),
        "offloaded": offloaded if layout.offload else 0,
    }
    log.info("activations: %s", counts)
    if layout.inputs and not layout.offload and offloaded:
        log.info("activations: the inputs of %d recomputing layers wait in pinned host memory", offloaded)
    return counts


class Offloader:
    """Saved tensors of the offloaded layers' forwards to pinned host memory, and back ahead of
    the backward.

    Each offloaded layer's forward is one group. In the forward, every storage the layer saves
    crosses to the host once (`_Group.pack`), on a side stream after the work that made it; the
    GPU storage is held until the layer's forward ends, then freed once its copy is done (the
    allocator waits for the side stream's recorded use). In the backward, the first tensor
    asked of a group brings the whole group back on the side stream, and the group the backward
    reaches next (the layer before it) starts its copy back at the same moment: its transfer
    runs under this layer's backward, about twice a forward's compute (the planner's
    `offload_stall_seconds` counts what is not hidden). At most two groups are on the GPU in
    the backward, what the plan counts (`memory.layer_pass_temporaries`).

    One side stream per GPU (deviceMap places layers on several). On the CPU the "host copy" is
    a copy and the copy back hands it over, so the grouping, the one copy per storage and the
    views are tested where no GPU is."""

    def __init__(self) -> None:
        self.groups: list[_Group] = []
        self._streams: dict[int, torch.cuda.Stream] = {}
        self._reached: _Group | None = None
        self.copied_bytes = 0  # out to the host in the last forward
        self._said = False

    def side_stream(self, device: torch.device) -> torch.cuda.Stream:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._streams:
            # torch 2.7 leaves Stream.__new__ unannotated.
            self._streams[index] = torch.cuda.Stream(device=index)  # type: ignore[no-untyped-call]
        return self._streams[index]

    def begin(self, first: bool) -> _Group:
        """A new group for an offloaded layer's forward; the first layer starts a new forward,
        whose groups replace the last one's (what it left in host memory goes back to the
        pinned allocator's cache)."""
        if first:
            if self.groups and not self._said:
                # Once, what one forward moved: the plan counts full_layer_activation_bytes per layer.
                self._said = True
                log.info(
                    "offload: %d layers, %.2f GiB to host memory per forward (%.3f GiB per layer)",
                    len(self.groups),
                    self.copied_bytes / 2**30,
                    self.copied_bytes / 2**30 / len(self.groups),
                )
            self.groups = []
            self._reached = None
            self.copied_bytes = 0
        if len(self.groups) >= 2:
            # The CPU queues the forward far ahead of the GPU; waiting here for the copies of
            # the layer two back keeps at most two layers' saved tensors on the GPU in the
            # forward (the one running and the one crossing), as the plan counts, and lets the
            # allocator reuse their memory instead of growing.
            self.groups[-2].wait_copied()
        group = _Group(self, len(self.groups))
        self.groups.append(group)
        return group

    def copy_out(self, slot: _Slot, storage: torch.UntypedStorage) -> None:
        whole = torch.empty(0, dtype=torch.uint8, device=slot.device).set_(storage)
        self.copied_bytes += storage.nbytes()
        if slot.device.type != "cuda":
            slot.host = whole.clone()
            return
        stream = self.side_stream(slot.device)
        stream.wait_stream(torch.cuda.current_stream(slot.device))
        slot.host = torch.empty(whole.shape, dtype=torch.uint8, pin_memory=True)
        with torch.cuda.stream(stream):
            slot.host.copy_(whole, non_blocking=True)
        whole.record_stream(stream)

    def fetch(self, group: _Group) -> None:
        """Start bringing `group` back (once per backward)."""
        if group.fetched:
            return
        group.fetched = True
        for slot in group.slots.values():
            self._copy_back(slot)

    def _copy_back(self, slot: _Slot) -> None:
        if slot.host is None or slot.gpu is not None:
            return
        if slot.device.type != "cuda":
            slot.gpu = slot.host
            return
        current = torch.cuda.current_stream(slot.device)
        # Allocated on the backward's stream, from its pool (a side-stream allocation would keep
        # its own pool, which the backward's frees cannot refill); the side stream starts the
        # copy once the backward's work queued so far is done with that memory.
        slot.gpu = torch.empty(slot.host.shape, dtype=torch.uint8, device=slot.device)
        stream = self.side_stream(slot.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            slot.gpu.copy_(slot.host, non_blocking=True)
        # torch 2.7 leaves Event.__new__ and Event.record unannotated.
        slot.ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
        slot.ready.record(stream)  # type: ignore[no-untyped-call]

    def reached(self, group: _Group) -> None:
        """The backward asks `group` for a tensor: bring it back if the prefetch has not, and
        start the next group's copy back (the layer before, in the forward's order)."""
        if group is self._reached:
            return
        self._reached = group
        self.fetch(group)
        if group.index > 0:
            self.fetch(self.groups[group.index - 1])

    def on_gpu(self, slot: _Slot) -> torch.Tensor:
        """The slot's storage on its device, the backward's stream waiting for its copy."""
        if slot.gpu is None:  # asked again after it was handed back: bring it back again
            self._copy_back(slot)
        assert slot.gpu is not None
        if slot.ready is not None:
            torch.cuda.current_stream(slot.device).wait_event(slot.ready)
            slot.ready = None
        return slot.gpu

    def attach(self, layer: nn.Module, first: bool) -> None:
        """Every forward of `layer` with gradients runs under this offloader's hooks; `first`:
        the first offloaded layer of the model, whose forward starts a new forward's groups."""
        entered: list[tuple[torch.autograd.graph.saved_tensors_hooks, _Group]] = []

        def enter(module: nn.Module, args: Any) -> None:
            if torch.is_grad_enabled() and module.training:
                group = self.begin(first)
                hooks = torch.autograd.graph.saved_tensors_hooks(group.pack, group.unpack)
                hooks.__enter__()
                entered.append((hooks, group))

        def leave(module: nn.Module, args: Any, output: Any) -> None:
            if entered:
                hooks, group = entered.pop()
                hooks.__exit__(None, None, None)
                group.close()

        layer.register_forward_pre_hook(enter)
        layer.register_forward_hook(leave)


class _Slot:
    """One storage a layer's forward saved, in host memory from the forward to the backward.

    Autograd often saves one storage several times in a layer (a norm's input for its square and
    for its product, the attention probabilities as two views): each storage crosses the link
    once, and each saved tensor comes back as its own view of it. `uses` counts the saved
    tensors not yet handed back; at 0 the slot lets go of its GPU copy (autograd's views hold
    it as long as they need it)."""

    __slots__ = ("device", "gpu", "host", "ready", "source", "uses")

    def __init__(self, storage: torch.UntypedStorage, device: torch.device) -> None:
        # Held while the layer's forward runs, so no other storage takes its address (the key).
        self.source: torch.UntypedStorage | None = storage
        self.device = device
        self.host: torch.Tensor | None = None
        self.gpu: torch.Tensor | None = None
        self.ready: torch.cuda.Event | None = None  # the copy back's event (GPU), until the backward waits for it
        self.uses = 0


class _Group:
    """The slots of one offloaded layer's forward; `index`: its place in the forward."""

    def __init__(self, offloader: Offloader, index: int) -> None:
        self.offloader = offloader
        self.index = index
        self.slots: dict[int, _Slot] = {}
        self.fetched = False
        self.copied: torch.cuda.Event | None = None  # the side stream's event after the copies out (GPU)

    def pack(self, tensor: torch.Tensor) -> Any:
        if stays(tensor):
            return tensor
        storage = tensor.untyped_storage()
        slot = self.slots.get(storage.data_ptr())
        if slot is None:
            slot = self.slots[storage.data_ptr()] = _Slot(storage, tensor.device)
            self.offloader.copy_out(slot, storage)
        slot.uses += 1
        return _Saved(slot, tensor.dtype, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))

    def unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        saved: _Saved = packed
        self.offloader.reached(self)
        source = self.offloader.on_gpu(saved.slot)
        view = torch.empty(0, dtype=saved.dtype, device=source.device).set_(
            source.untyped_storage(), saved.offset, saved.size, saved.stride
        )
        saved.slot.uses -= 1
        if saved.slot.uses == 0:
            saved.slot.gpu = None
        return view

    def close(self) -> None:
        """The layer's forward is over: its saved storages may go once copied out."""
        for slot in self.slots.values():
            slot.source = None
            if slot.device.type == "cuda" and self.copied is None:
                # torch 2.7 leaves Event.__new__ and Event.record unannotated.
                self.copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
                self.copied.record(self.offloader.side_stream(slot.device))  # type: ignore[no-untyped-call]

    def wait_copied(self) -> None:
        if self.copied is not None:
            self.copied.synchronize()
            self.copied = None


@dataclass(frozen=True)
class _Saved:
    """What autograd keeps for one offloaded tensor: which storage, and the view of it."""

    slot: _Slot
    dtype: torch.dtype
    offset: int | torch.SymInt
    size: tuple[int, ...]
    stride: tuple[int, ...]


def stays(tensor: torch.Tensor) -> bool:
    """Tensors the offload leaves where they are: parameters and views of them (a linear saves
    its weight transposed; a weight never changes, so a copy would move it for nothing), small
    ones (the copy costs more than the memory it frees) and small views of a larger storage
    (the copy moves a whole storage)."""
    if isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter):
        return True
    nbytes = tensor.numel() * tensor.element_size()
    return nbytes < MIN_OFFLOAD_BYTES or tensor.untyped_storage().nbytes() > 2 * nbytes

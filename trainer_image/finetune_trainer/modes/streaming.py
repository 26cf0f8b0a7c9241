"""fsdp's streamed loading: the model built on the meta device, its weights read unit by unit.

`skeleton` builds the model as today's loader does (transformers' own `from_pretrained`, with
the same quantisation config, dtype and attention), but from the checkpoint's headers alone and
onto the meta device: every module, the 4-bit Linear layers included, and no weight. LoRA and the
k-bit preparation then go on as before (they change dtypes and flags, not values).

`Stream.materialise` is FSDP's `param_init_fn`: FSDP calls it on each unit (a decoder layer,
the embeddings, the head, then the root) just before it shards that unit. Each tensor of the
unit has one owner rank (the unit's bytes split evenly); the owners read their tensors from the
checkpoint's files and quantise them on their own GPU, in parallel, with bitsandbytes' kernel and
the casts of today's loader; then each result is broadcast from its owner. So each byte of the
checkpoint is read once per pod, no process holds more than one tensor of it on the host, and
the GPU holds one unit whole only until FSDP keeps its shard.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from .checkpoint_files import CheckpointFiles
from .shared_tensors import share

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel


@dataclass(frozen=True)
class Source:
    """Where a model tensor comes from and how today's loader turns the stored one into it."""

    key: str  # the checkpoint's name for it
    load_dtype: torch.dtype  # the dtype from_pretrained loads it in (a 4-bit weight's input)
    quantised: bool
    transposed: bool  # a Conv1D weight, which transformers transposes before quantising


def skeleton(model_config: PretrainedConfig, files: CheckpointFiles, kwargs: dict[str, Any]) -> PreTrainedModel:
    """The model `from_pretrained(**kwargs)` makes, on the meta device, no weight read."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    # The lazy mapping's annotation says a pair of optional classes; its item is the model's class.
    model_class: Any = MODEL_FOR_CAUSAL_LM_MAPPING[type(model_config)]
    stored = {key: files.meta(key) for key in files.names()}
    model: PreTrainedModel = model_class.from_pretrained(
        None, config=model_config, state_dict=stored, device_map={"": "meta"}, **kwargs
    )
    return model


@contextmanager
def adapter_on_host() -> Iterator[None]:
    """While open, a move to the meta device leaves a module where it is (a dtype still applies).
    PEFT moves each new adapter to its base layer's device: beside a base on the meta device
    that would drop the adapter's initial weights. Inside, the adapter stays on the host, as
    beside a base loaded on the host, with the same initial weights."""
    original: Any = nn.Module.to

    def _to(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type == "meta":
            moved: nn.Module = original(self, dtype=dtype) if dtype is not None else self
            return moved
        kept: nn.Module = original(self, *args, **kwargs)
        return kept

    # mypy refuses assigning to a method, and `to`'s overloads to one function: the patch is the point (undone below).
    nn.Module.to = _to  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        # mypy refuses assigning to a method: putting torch's own back.
        nn.Module.to = original  # type: ignore[method-assign]


def _model_names(model: Any, stored: list[str]) -> dict[str, str] | str:
    """The model's name of each stored tensor, renamed as transformers renames it; a reason
    instead when transformers converts (fuses, splits) any of them: those load as before."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    transforms = get_model_conversion_mapping(model, None, getattr(model, "hf_quantizer", None))
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    expected = model.state_dict(keep_vars=True)
    prefix = model.base_model_prefix
    names: dict[str, str] = {}
    for key in stored:
        name, converted = rename_source_key(key, renamings, converters, prefix, expected)
        if name not in expected and key in expected:
            name, converted = rename_source_key(key, [], [], base_model_prefix=prefix, meta_state_dict=expected)
        if name in expected:
            if converted is not None:
                return f"transformers converts the stored tensor {key}"
            names[name] = key
    return names


def sources(model: Any, stored: list[str]) -> dict[int, Source] | str:
    """Every model tensor's source, by the tensor's identity (tied weights share one); a reason
    instead when the checkpoint cannot be streamed. Buffers no checkpoint holds (rotary
    frequencies, Gemma's embedding scale) are computed as from_pretrained computes them."""
    from transformers.pytorch_utils import Conv1D

    names = _model_names(model, stored)
    if isinstance(names, str):
        return names
    quantizer = getattr(model, "hf_quantizer", None)
    found: dict[int, Source] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if name in names:
            module = model.get_submodule(name.rpartition(".")[0])
            quantised = quantizer is not None and quantizer.param_needs_quantization(model, name)
            transposed = issubclass(getattr(module, "source_cls", nn.Module), Conv1D)
            found[id(tensor)] = Source(names[name], tensor.dtype, quantised, transposed)
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in found:
            return f"the checkpoint has no tensor for {name}"
    return found


def _owners(sizes: list[int], load: list[int]) -> list[int]:
    """Each tensor's owner rank: largest first to the rank that has read least so far, `load`
    (bytes per rank, updated; the same on every rank, so every rank agrees on the owners)."""
    world = len(load)
    owner = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[index] = rank
        load[rank] += sizes[index]
    return owner


Slot = tuple[nn.Module, str, bool]  # a module, the attribute's name, whether it is a buffer


def _meta_tensors(root: nn.Module) -> dict[int, tuple[torch.Tensor, list[Slot]]]:
    """The meta tensors under `root` (not under units FSDP has already wrapped), each with every
    place that holds it (tied weights: more than one), in the order the modules nest."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    found: dict[int, tuple[torch.Tensor, list[Slot]]] = {}
    queue = [root]
    while queue:
        module = queue.pop(0)
        held: list[tuple[str, torch.Tensor | None, bool]] = [(n, t, False) for n, t in module._parameters.items()]
        held += [(n, t, True) for n, t in module._buffers.items()]
        for name, tensor, is_buffer in held:
            if tensor is not None and tensor.is_meta:
                found.setdefault(id(tensor), (tensor, []))[1].append((module, name, is_buffer))
        queue.extend(c for c in module.children() if not isinstance(c, FullyShardedDataParallel))
    return found


def _place(value: torch.Tensor, tensor: torch.Tensor, slots: list[Slot]) -> None:
    from bitsandbytes.nn.modules import Params4bit

    if isinstance(value, Params4bit):
        new: torch.Tensor = value
    elif slots[0][2]:
        new = value
    else:
        new = nn.Parameter(value, requires_grad=tensor.requires_grad)
    # As from_pretrained marks what it loaded: transformers' init functions, run next on the
    # buffers computed at load (`_compute_derived`), leave a marked tensor as it is.
    # An attribute transformers reads off a tensor, which torch's Tensor does not declare.
    new._is_hf_initialized = True  # type: ignore[attr-defined]
    for module, name, is_buffer in slots:
        if is_buffer:
            module._buffers[name] = new
        else:
            # `_parameters` is typed for Parameters; `new` is one, or bitsandbytes' Params4bit (a Tensor).
            module._parameters[name] = new  # type: ignore[assignment]


def _init_functions(model: nn.Module) -> dict[nn.Module, Any]:
    """Each module's `_init_weights`: that of the innermost transformers model holding it (the
    function today's loader runs on buffers computed at load, such as rotary frequencies)."""
    from transformers import PreTrainedModel

    found: dict[nn.Module, Any] = {}
    for outer in model.modules():
        if isinstance(outer, PreTrainedModel):
            for module in outer.modules():
                found[module] = outer._init_weights  # an inner model, visited later, overrides
    return found


class Stream:
    """The checkpoint's reader for one rank of an fsdp pod; `materialise` is FSDP's param_init_fn."""

    def __init__(
        self, model: nn.Module, files: CheckpointFiles, found: dict[int, Source], device: torch.device
    ) -> None:
        self.files = files
        self.sources = found
        self.device = device
        self.init_of = _init_functions(model)
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.load = [0] * self.world  # bytes each rank was given to read, over the units so far

    def _make(self, tensor: torch.Tensor, source: Source, module: Any) -> torch.Tensor:
        """One tensor as today's loader makes it: read, cast to its load dtype, quantised or cast
        on to the dtype the model now has for it. The casts run on the rank's device: widening is
        exact and narrowing rounds to nearest even there as on the host, so the bits are the same."""
        from bitsandbytes.nn.modules import Params4bit

        value = self.files.read(source.key).to(self.device).to(source.load_dtype)
        if not source.quantised:
            return value.to(tensor.dtype)
        if source.transposed:
            value = value.T
        fields = {k: getattr(tensor, k) for k in ("blocksize", "compress_statistics", "quant_type", "quant_storage")}
        weight: Any = Params4bit(value, requires_grad=False, module=module, **fields)
        quantised: torch.Tensor = weight.to(self.device)  # bitsandbytes' kernel on this device
        return quantised

    def materialise(self, root: nn.Module) -> None:
        """Every meta tensor under `root`: read and made by its owner, then shared; the buffers
        computed at load computed on every rank. Every rank calls it on the same units in turn."""
        pending = _meta_tensors(root)
        loaded = [(t, slots) for t, slots in pending.values() if id(t) in self.sources]
        owners = _owners([t.numel() * t.element_size() for t, _ in loaded], self.load)
        made = {
            i: self._make(t, self.sources[id(t)], slots[0][0])
            for i, (t, slots) in enumerate(loaded)
            if owners[i] == self.rank
        }
        for i, (tensor, slots) in enumerate(loaded):
            value = made.pop(i, None)
            if self.world > 1:
                value = share(value, owners[i], self.device, slots[0][0])
            assert value is not None
            _place(value, tensor, slots)
        self._compute_derived([(t, s) for t, s in pending.values() if id(t) not in self.sources])

    def _compute_derived(self, derived: list[tuple[torch.Tensor, list[Slot]]]) -> None:
        """Buffers no checkpoint holds (rotary frequencies, an embedding scale): computed on every
        rank by the function from_pretrained runs on them, which leaves the loaded (marked)
        weights of the same module alone."""
        modules: dict[nn.Module, None] = {}
        for tensor, slots in derived:
            for module, name, _ in slots:
                module._buffers[name] = torch.empty_like(tensor, device=self.device)
                modules[module] = None
        with torch.no_grad():
            for module in modules:
                self.init_of[module](module)

    def close(self) -> None:
        self.files.close()

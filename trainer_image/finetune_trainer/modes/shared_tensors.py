"""One rank's loaded tensor sent to every rank: a plain tensor, or a 4-bit weight with its state.

The streamed loader (`streaming`) has each tensor of the checkpoint read and quantised by one
rank, its owner; the others receive the result here. A 4-bit weight (bitsandbytes' `Params4bit`)
travels as its packed data plus every tensor of its `QuantState` (absmax, code, the nested
state's absmax and code, the offset) and the state's other fields (shape, dtype, blocksize,
quant type) in a small header, so the receiver rebuilds the very object the owner made: the same
bytes, bit for bit. The header goes first (`broadcast_object_list`), then each tensor on the
process group's device (NCCL on GPUs, gloo on the host).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

# A header describes a value: ("tensor", shape, dtype) or ("4bit", data header, state header, fields).
Header = tuple[Any, ...]


def _state_header(state: Any, tensors: list[torch.Tensor]) -> dict[str, Any]:
    """A QuantState's fields, its tensors replaced by their shape and dtype (appended to `tensors`)."""
    header: dict[str, Any] = {}
    for name, value in vars(state).items():
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            header[name] = ("tensor", tuple(value.shape), value.dtype)
        elif name == "state2" and value is not None:
            header[name] = ("state", _state_header(value, tensors))
        else:
            header[name] = ("value", value)
    return header


def describe(value: torch.Tensor) -> tuple[Header, list[torch.Tensor]]:
    """The header of `value` and the tensors to broadcast after it, in order."""
    from bitsandbytes.nn.modules import Params4bit

    if isinstance(value, Params4bit):
        tensors: list[torch.Tensor] = [value.data]
        state = _state_header(value.quant_state, tensors)
        fields = {
            "blocksize": value.blocksize,
            "compress_statistics": value.compress_statistics,
            "quant_type": value.quant_type,
            "quant_storage": value.quant_storage,
        }
        return ("4bit", (tuple(value.data.shape), value.data.dtype), state, fields), tensors
    return ("tensor", tuple(value.shape), value.dtype), [value.data]


def _receive(shape: tuple[int, ...], dtype: torch.dtype, src: int, device: torch.device) -> torch.Tensor:
    tensor = torch.empty(shape, dtype=dtype, device=device)
    dist.broadcast(tensor, src=src)
    return tensor


def _rebuild_state(header: dict[str, Any], src: int, device: torch.device) -> Any:
    from bitsandbytes.functional import QuantState

    state = QuantState.__new__(QuantState)
    for name, (kind, *rest) in header.items():
        if kind == "tensor":
            setattr(state, name, _receive(rest[0], rest[1], src, device))
        elif kind == "state":
            setattr(state, name, _rebuild_state(rest[0], src, device))
        else:
            setattr(state, name, rest[0])
    return state


def receive(header: Header, src: int, device: torch.device, module: Any) -> torch.Tensor:
    """The value `header` describes, its tensors received from `src` in `describe`'s order."""
    if header[0] == "tensor":
        return _receive(header[1], header[2], src, device)
    from bitsandbytes.nn.modules import Params4bit

    _, (shape, dtype), state_header, fields = header
    data = _receive(shape, dtype, src, device)
    state = _rebuild_state(state_header, src, device)
    param = Params4bit(data, requires_grad=False, quant_state=state, module=module, bnb_quantized=True, **fields)
    # As bitsandbytes' own quantisation does: FSDP's flat views lose the parameter's state, and
    # Linear4bit restores it from the module's.
    module.quant_state = state
    return param


def share(value: torch.Tensor | None, src: int, device: torch.device, module: Any) -> torch.Tensor:
    """On `src`, `value` (sent to every rank); elsewhere, what `src` sent. Every rank calls it."""
    mine = dist.get_rank() == src
    header: list[Any] = [None]
    tensors: list[torch.Tensor] = []
    if mine:
        assert value is not None
        header[0], tensors = describe(value)
    dist.broadcast_object_list(header, src=src, device=device)
    if mine:
        for tensor in tensors:
            # On the group's device (a state tensor bitsandbytes kept elsewhere goes there too,
            # where the receivers build theirs and where FSDP would move the owner's).
            dist.broadcast(tensor.to(device).contiguous(), src=src)
        assert value is not None
        return value
    return receive(header[0], src, device, module)

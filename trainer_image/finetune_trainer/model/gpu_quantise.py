"""Quantise weights headed for the host on this rank's GPU, one tensor at a time.

fsdp loads the model on the host (`device_map={"": "cpu"}`) so that no GPU ever holds it whole,
and `modes.fsdp` then moves it to the GPUs one decoder layer at a time, keeping each
rank's shard. Left alone, bitsandbytes quantises those weights on the CPU: minutes for a 40-layer
70B slice, with every process doing it. Inside `quantising_on(gpu)`, each 4-bit weight is sent
to the rank's GPU, quantised there by the same kernel dataParallel uses, and its packed data and
quantisation state come straight back to the host. The GPU holds one weight at a time; the host
holds the packed model, as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def quantising_on(device: torch.device) -> Iterator[None]:
    """While open, a 4-bit weight quantised for the CPU is quantised on `device` and brought back."""
    if device.type != "cuda":
        yield
        return
    from bitsandbytes.nn.modules import Params4bit

    original: Any = Params4bit._quantize

    def _quantize(self: Any, target: torch.device) -> Any:
        if torch.device(target).type != "cpu":
            return original(self, target)
        original(self, device)
        self.data = self.data.to("cpu")
        # QuantState.to moves absmax, code and the nested state in place; the module holds the same object.
        self.quant_state.to("cpu")
        return self

    # mypy refuses assigning to a method: the patch is the point (undone below).
    Params4bit._quantize = _quantize  # type: ignore[method-assign]
    try:
        yield
    finally:
        # mypy refuses assigning to a method: putting bitsandbytes' own back.
        Params4bit._quantize = original  # type: ignore[method-assign]

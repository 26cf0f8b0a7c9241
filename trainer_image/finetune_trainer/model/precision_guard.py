"""The precision guard: in an fp32 run, no parameter, buffer or activation may be bf16/fp16.

Libraries cast behind the caller's back: TRL's SFTTrainer turns every trainable LoRA weight of
a 4-bit model into bf16 at construction, even with bf16=False; transformers 5 loads with
`dtype="auto"`. On Pascal any such tensor ends the run hours in ("BFloat16 not implemented").
So the guard re-casts what is known to be cast, then proves the rest, and fails before the
first optimizer step with the names of the offending modules.
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from finetune_api.reasons import ExitReason

from ..failures import TrainerFailure

log = logging.getLogger(__name__)

HALF = (torch.float16, torch.bfloat16)
MAX_NAMES = 20
# Modules that the recipe keeps in fp32 even when frozen: normalisation and the LM head.
ALWAYS_FP32 = ("norm", "lm_head")


@dataclass
class GuardReport:
    recast: list[str] = field(default_factory=list)
    half_parameters: list[str] = field(default_factory=list)
    half_buffers: list[str] = field(default_factory=list)
    half_activations: list[str] = field(default_factory=list)
    checked_parameters: int = 0
    checked_buffers: int = 0
    checked_activations: int = 0

    @property
    def clean(self) -> bool:
        return not (self.half_parameters or self.half_buffers or self.half_activations)

    def summary(self) -> dict[str, Any]:
        return {
            "recastToFloat32": len(self.recast),
            "halfParameters": len(self.half_parameters),
            "halfBuffers": len(self.half_buffers),
            "halfActivations": len(self.half_activations),
            "checkedParameters": self.checked_parameters,
            "checkedBuffers": self.checked_buffers,
            "checkedActivations": self.checked_activations,
        }


def _names(items: list[str]) -> str:
    shown = ", ".join(items[:MAX_NAMES])
    return shown + (f" and {len(items) - MAX_NAMES} more" if len(items) > MAX_NAMES else "")


def recast_to_fp32(model: nn.Module) -> list[str]:
    """Cast trainable parameters, norms and the LM head back to float32; return what changed."""
    changed: list[str] = []
    for name, param in model.named_parameters():
        if param.dtype in HALF and (param.requires_grad or any(k in name.lower() for k in ALWAYS_FP32)):
            param.data = param.data.to(torch.float32)
            changed.append(name)
    if changed:
        log.info("precision guard: re-cast %d tensors to float32 (e.g. %s)", len(changed), changed[0])
    return changed


def scan_tensors(model: nn.Module, report: GuardReport) -> None:
    for name, param in model.named_parameters():
        report.checked_parameters += 1
        if param.dtype in HALF:
            report.half_parameters.append(f"{name} ({param.dtype})")
    for name, buffer in model.named_buffers():
        report.checked_buffers += 1
        if buffer.dtype in HALF:
            report.half_buffers.append(f"{name} ({buffer.dtype})")


def _half_in(value: Any) -> torch.dtype | None:
    if isinstance(value, torch.Tensor):
        return value.dtype if value.dtype in HALF else None
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _half_in(item)
            if found is not None:
                return found
    return None


@contextmanager
def watch_activations(model: nn.Module, report: GuardReport) -> Iterator[None]:
    """Record every module whose forward output holds a bf16/fp16 tensor while the block runs."""
    seen: set[str] = set()

    def hook(name: str) -> Any:
        def check(_module: nn.Module, _inputs: Any, output: Any) -> None:
            report.checked_activations += 1
            dtype = _half_in(output)
            if dtype is not None and name not in seen:
                seen.add(name)
                report.half_activations.append(f"{name or '<model>'} ({dtype})")

        return check

    handles = [module.register_forward_hook(hook(name)) for name, module in model.named_modules()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def fail_if_half(report: GuardReport) -> None:
    if report.clean:
        return
    parts = []
    if report.half_parameters:
        parts.append(f"parameters: {_names(report.half_parameters)}")
    if report.half_buffers:
        parts.append(f"buffers: {_names(report.half_buffers)}")
    if report.half_activations:
        parts.append(f"activations of modules: {_names(report.half_activations)}")
    raise TrainerFailure(
        ExitReason.PrecisionViolation,
        "precision fp32, but half-precision tensors were found (" + "; ".join(parts) + ")",
    )

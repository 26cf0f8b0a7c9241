"""What a checkpoint holds, in a form that does not depend on the process count.

The adapter (PEFT's own file layout, so a checkpoint folder also loads as an adapter), the
optimizer and scheduler state, and the step. Every rank holds the same adapter and optimizer
state (the adapter is never sharded), so rank 0 writes them alone and any process count reads
them back. The data position is the step itself: the schedule (`data.batches.Schedule`) is a
pure function of the seed and the step, and each micro-batch's dropout is seeded by its number.

A checkpoint written on SIGTERM between micro-batches adds the step in progress (`Partial`): how
many micro-batches every rank finished, and their adapter gradients and loss figures summed over
the ranks. Rank 0 of the resumed run starts the step from those sums, the other ranks from zero,
so the step's one all-reduce gives the gradient of the uninterrupted step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

ADAPTER_WEIGHTS = "adapter_model.safetensors"
OPTIMIZER = "optimizer.pt"
SCHEDULER = "scheduler.pt"
STATE = "trainer_state.json"
PARTIAL = "partial_step.pt"


@dataclass
class Adapter:
    """The PEFT model (before any FSDP wrapping) and its trainable parameters by name."""

    peft_model: nn.Module
    named: list[tuple[str, nn.Parameter]]

    @classmethod
    def of(cls, peft_model: nn.Module) -> Adapter:
        return cls(peft_model, [(n, p) for n, p in peft_model.named_parameters() if p.requires_grad])

    @property
    def params(self) -> list[nn.Parameter]:
        return [p for _, p in self.named]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """PEFT's saved names and tensors, read straight from the parameters: never through
        the model's state_dict, which under FSDP would gather the whole base model (and whose
        module names then carry FSDP's wrapper prefixes)."""
        return {_saved_name(name): p.detach().to("cpu", copy=True).contiguous() for name, p in self.named}

    def save(self, folder: Path) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        save_file(self.state_dict(), str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        configs: Any = self.peft_model.peft_config
        configs[ADAPTER_NAME].save_pretrained(str(folder))

    def load(self, folder: Path) -> None:
        from safetensors.torch import load_file

        saved = load_file(str(folder / ADAPTER_WEIGHTS))
        by_saved_name = {_saved_name(name): p for name, p in self.named}
        missing = sorted(set(by_saved_name) - set(saved))
        if missing:
            raise ValueError(f"{folder}: the checkpoint lacks {len(missing)} adapter tensors, e.g. {missing[0]}")
        with torch.no_grad():
            for name, param in by_saved_name.items():
                param.copy_(saved[name].to(param.device, param.dtype))


ADAPTER_NAME = "default"


def _saved_name(name: str) -> str:
    # PEFT saves without the adapter name: `...q_proj.lora_A.default.weight` -> `...q_proj.lora_A.weight`.
    return name.replace(f".{ADAPTER_NAME}.", ".")


@dataclass(frozen=True)
class Partial:
    """Optimizer step `step` (0-based) stopped after `micro_done` of its micro-batches on every rank."""

    step: int
    micro_done: int
    loss: float  # summed over ranks, already scaled like the step's
    tokens: float
    world_size: int
    accumulation: int
    grads: dict[str, torch.Tensor]  # PEFT's saved names, summed over ranks, on the CPU
    sums: tuple[float, ...] = ()  # the objective's figures so far, summed over ranks

    def fits(self, world_size: int, accumulation: int) -> bool:
        """Its micro-batches are numbered for one process count and accumulation only."""
        return (self.world_size, self.accumulation) == (world_size, accumulation)


def partial_of(
    adapter: Adapter, step: int, micro_done: int, figures: list[float], *, world_size: int, accumulation: int
) -> Partial:
    """The step in progress, from gradients already summed over the ranks."""
    grads = {
        _saved_name(name): (p.grad if p.grad is not None else torch.zeros_like(p)).detach().to("cpu", copy=True)
        for name, p in adapter.named
    }
    return Partial(step, micro_done, figures[0], figures[1], world_size, accumulation, grads, tuple(figures[2:]))


def restore_gradients(adapter: Adapter, partial: Partial | None) -> None:
    """Start the step from `partial`'s sums (rank 0 only), or from zero."""
    for name, param in adapter.named:
        if partial is None:
            param.grad = None
        else:
            param.grad = partial.grads[_saved_name(name)].to(param.device, param.dtype).clone()


@dataclass(frozen=True)
class Progress:
    step: int
    tokens: int
    world_size: int
    parallelism: str
    trained_tokens: int = 0  # targets of the loss so far (a checkpoint before it was counted: 0)


def save(
    folder: Path,
    adapter: Adapter,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    progress: Progress,
    *,
    partial: Partial | None = None,
) -> None:
    adapter.save(folder)
    torch.save(optimizer.state_dict(), folder / OPTIMIZER)
    # torch 2.7 leaves LRScheduler.state_dict unannotated.
    torch.save(scheduler.state_dict(), folder / SCHEDULER)  # type: ignore[no-untyped-call]
    state = {
        "step": progress.step,
        "tokens": progress.tokens,
        "trainedTokens": progress.trained_tokens,
        "worldSize": progress.world_size,
        "parallelism": progress.parallelism,
    }
    if partial is not None:
        torch.save(
            {
                "step": partial.step,
                "microDone": partial.micro_done,
                "loss": partial.loss,
                "tokens": partial.tokens,
                "worldSize": partial.world_size,
                "accumulation": partial.accumulation,
                "grads": partial.grads,
                "sums": list(partial.sums),
            },
            folder / PARTIAL,
        )
        state["partialStep"] = {"microBatchesDone": partial.micro_done, "of": partial.accumulation}
    (folder / STATE).write_text(json.dumps(state, indent=1), encoding="utf-8")


def load(
    folder: Path, adapter: Adapter, optimizer: torch.optim.Optimizer, scheduler: LRScheduler
) -> tuple[int, int, dict[str, Any], Partial | None]:
    """Restore a checkpoint into this process; returns (step, tokens seen, the saved state, the
    step in progress when it was written on SIGTERM)."""
    adapter.load(folder)
    optimizer.load_state_dict(torch.load(folder / OPTIMIZER, map_location="cpu", weights_only=False))
    scheduler.load_state_dict(torch.load(folder / SCHEDULER, map_location="cpu", weights_only=False))
    state = json.loads((folder / STATE).read_text(encoding="utf-8"))
    partial = None
    if (folder / PARTIAL).exists():
        saved = torch.load(folder / PARTIAL, map_location="cpu", weights_only=True)
        partial = Partial(
            int(saved["step"]),
            int(saved["microDone"]),
            float(saved["loss"]),
            float(saved["tokens"]),
            int(saved["worldSize"]),
            int(saved["accumulation"]),
            dict(saved["grads"]),
            tuple(float(v) for v in saved.get("sums", ())),
        )
    return int(state["step"]), int(state.get("tokens", 0)), state, partial

"""What a checkpoint holds, in a form that does not depend on the process count.

The adapter (PEFT's own file layout, so a checkpoint folder also loads as an adapter), the
optimizer and scheduler state, and the step. Every rank holds the same adapter and optimizer
state (the adapter is never sharded), so rank 0 writes them alone and any process count reads
them back. The data position is the step itself: the schedule (`data.batches.Schedule`) is a
pure function of the seed and the step, and each micro-batch's dropout is seeded by its number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

ADAPTER_WEIGHTS = "adapter_model.safetensors"
OPTIMIZER = "optimizer.pt"
SCHEDULER = "scheduler.pt"
STATE = "trainer_state.json"


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
class Progress:
    step: int
    tokens: int
    world_size: int
    parallelism: str


def save(
    folder: Path,
    adapter: Adapter,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    progress: Progress,
) -> None:
    adapter.save(folder)
    torch.save(optimizer.state_dict(), folder / OPTIMIZER)
    torch.save(scheduler.state_dict(), folder / SCHEDULER)
    state = {
        "step": progress.step,
        "tokens": progress.tokens,
        "worldSize": progress.world_size,
        "parallelism": progress.parallelism,
    }
    (folder / STATE).write_text(json.dumps(state, indent=1), encoding="utf-8")


def load(
    folder: Path, adapter: Adapter, optimizer: torch.optim.Optimizer, scheduler: Any
) -> tuple[int, int, dict[str, Any]]:
    """Restore a checkpoint into this process; returns (step, tokens seen, the saved state)."""
    adapter.load(folder)
    optimizer.load_state_dict(torch.load(folder / OPTIMIZER, map_location="cpu", weights_only=False))
    scheduler.load_state_dict(torch.load(folder / SCHEDULER, map_location="cpu", weights_only=False))
    state = json.loads((folder / STATE).read_text(encoding="utf-8"))
    return int(state["step"]), int(state.get("tokens", 0)), state

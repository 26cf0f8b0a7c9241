"""The rollout engine: the policy (NF4 base + LoRA, FP32) writes each prompt's G completions.

One seam (`RolloutEngine`) stands between the objective and the generation, so that a faster
engine (llama.cpp on Pascal) can take its place: it is given prompts as token ids and a key per
completion (sampling.py) and returns completions as token ids, ending at the first end token
(kept) or at `max_new_tokens`.

`PolicyRollouts`, the engine the trainer has, runs one prompt's group at a time as a batch of G
rows: they share the prompt, so no row is padded and no attention mask is needed. Where the rank
generates alone it keeps transformers' KV cache (the prompt once, then each new token alone, the
model in eval mode as the sample answers run it: outputs/samples.py says why). Under fsdp every
rank runs every forward in lockstep: each new token is a forward over the whole rows so far,
without a cache, with gradients on and a zero backward as the sample answers take them there,
and the ranks go on until every rank's group has ended; a rank with fewer prompts than another
runs a padding group (its first prompt again, or a one-token prompt) whose completions are
dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from ...distributed.gradsync import sum_figures
from ...model.dropout import dropout_off, inference
from ...model.loss_head import LossHead, logits_head
from .sampling import sample


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    temperature: float
    top_p: float
    end_ids: frozenset[int]


class RolloutEngine(Protocol):
    def generate(self, prompts: Sequence[list[int]], keys: Sequence[torch.Tensor]) -> list[list[list[int]]]:
        """For each prompt, one completion (token ids) per key of its `keys` entry."""
        ...


def _trimmed(tokens: list[int], end_ids: frozenset[int]) -> list[int]:
    for index, token in enumerate(tokens):
        if token in end_ids:
            return tokens[: index + 1]
    return tokens


@dataclass
class PolicyRollouts:
    model: nn.Module  # what the forwards go through (the FSDP module under fsdp)
    head: LossHead
    device: torch.device
    sampling: Sampling
    lockstep: bool = False  # fsdp: every rank runs every forward
    world_size: int = 1
    filler: list[int] = field(default_factory=lambda: [0])  # a padding group's prompt

    def generate(self, prompts: Sequence[list[int]], keys: Sequence[torch.Tensor]) -> list[list[list[int]]]:
        groups = len(prompts)
        if self.lockstep:  # every rank runs as many groups as the rank with the most
            groups = most(groups, self.world_size, self.device)
        out: list[list[list[int]]] = []
        with dropout_off(self.model), logits_head(self.head):
            for index in range(groups):
                if index < len(prompts):
                    out.append(self._group(prompts[index], keys[index]))
                else:
                    # A padding group: the forwards the other ranks' groups need, its tokens dropped.
                    self._group(self.filler, torch.zeros(2, dtype=torch.int64))
        return out

    def _group(self, prompt: list[int], keys: torch.Tensor) -> list[list[int]]:
        rows = keys.shape[0]
        tokens = torch.tensor([prompt] * rows, device=self.device)
        steps = self._steps_lockstep(tokens, keys) if self.lockstep else self._steps_cached(tokens, keys)
        return [_trimmed(row, self.sampling.end_ids) for row in steps]

    def _ended(self, chosen: torch.Tensor, ended: torch.Tensor) -> torch.Tensor:
        ends = torch.tensor(sorted(self.sampling.end_ids), device=chosen.device, dtype=chosen.dtype)
        return ended | torch.isin(chosen, ends)

    def _steps_cached(self, tokens: torch.Tensor, keys: torch.Tensor) -> list[list[int]]:
        settings = self.sampling
        ended = torch.zeros(tokens.shape[0], dtype=torch.bool, device=self.device)
        out: list[torch.Tensor] = []
        past: Any = None
        with torch.no_grad(), inference(self.model):
            for position in range(settings.max_new_tokens):
                result = self.model(input_ids=tokens, cache=past, use_cache=True)
                past = result.cache
                chosen = sample(result.logits[:, -1], keys, position, settings.temperature, settings.top_p)
                out.append(chosen)
                ended = self._ended(chosen, ended)
                if bool(ended.all()):
                    break
                tokens = chosen.unsqueeze(1)
        return torch.stack(out, dim=1).tolist() if out else [[] for _ in range(tokens.shape[0])]

    def _steps_lockstep(self, tokens: torch.Tensor, keys: torch.Tensor) -> list[list[int]]:
        settings = self.sampling
        ended = torch.zeros(tokens.shape[0], dtype=torch.bool, device=self.device)
        start = tokens.shape[1]
        for position in range(settings.max_new_tokens):
            # torch 2.7 leaves enable_grad's __init__ unannotated.
            with torch.enable_grad():  # type: ignore[no-untyped-call]
                logits: torch.Tensor = self.model(input_ids=tokens, use_cache=False).logits
                if logits.requires_grad:  # with the adapter switched off nothing needs a gradient
                    # torch 2.7 leaves Tensor.backward unannotated.
                    (logits.sum() * 0.0).backward()  # type: ignore[no-untyped-call]
            chosen = sample(logits[:, -1].detach(), keys, position, settings.temperature, settings.top_p)
            tokens = torch.cat([tokens, chosen.unsqueeze(1)], dim=1)
            ended = self._ended(chosen, ended)
            # Every rank runs the forward of the next token until every rank's group has ended.
            (running,) = sum_figures([0.0 if bool(ended.all()) else 1.0], self.world_size, self.device)
            if running == 0:
                break
        return tokens[:, start:].tolist()


def most(local: int, world: int, device: torch.device) -> int:
    """The largest of the ranks' `local` counts (a collective on every rank)."""
    if world == 1:
        return local
    value = torch.tensor([float(local)], dtype=torch.float64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.item())

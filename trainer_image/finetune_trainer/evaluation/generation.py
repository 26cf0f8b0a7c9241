"""Greedy answers of the base and the tuned model to held-out examples that have a reference
answer (an SFT sample's answer, a preference pair's chosen one), through the sample answers'
machinery (outputs/samples.py: the adapter switched off for the base, no second copy; under
fsdp every rank in lockstep), then scored against the references (metrics.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..distributed.gradsync import sum_figures
from ..distributed.topology import Topology
from ..model.loss_head import LossHead
from ..outputs import samples
from .metrics import scores

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Answering:
    """What answers: the PEFT model, the FSDP module around it when the mode shards (`runner`:
    every rank answers, in lockstep), the loss head, the tokenizer and the loop's device."""

    model: nn.Module
    head: LossHead
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    ranks: Topology
    runner: nn.Module | None = None


@dataclass(frozen=True)
class Generated:
    answers: list[dict[str, Any]] = field(default_factory=list)  # index, prompt, reference, base, tuned
    base: dict[str, float] = field(default_factory=dict)  # the metrics of the base's answers
    tuned: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # messages: the last assistant turn is the answer
        said = [m.get("content") for m in content if isinstance(m, dict) and m.get("role") == "assistant"]
        return said[-1] if said and isinstance(said[-1], str) else None
    return None


def reference_of(sample: dict[str, Any]) -> str | None:
    """The answer a held-out sample holds: its completion, its last assistant turn, or a pair's
    chosen answer; None for plain text."""
    for key in ("completion", "chosen", "messages"):
        if key in sample:
            return _text(sample[key])
    return None


def chosen(held_out: Sequence[dict[str, Any]], count: int, tokenizer: PreTrainedTokenizerBase) -> list[dict[str, Any]]:
    """The first `count` held-out examples with a prompt and a reference: index, prompt, reference."""
    found: list[dict[str, Any]] = []
    for index, sample in enumerate(held_out):
        if len(found) >= count:
            break
        prompt, reference = samples.prompt_of(dict(sample), tokenizer), reference_of(dict(sample))
        if prompt and reference:
            found.append({"index": index, "prompt": prompt, "reference": reference})
    return found


def generate(
    answering: Answering, examples: list[dict[str, Any]], max_new_tokens: int, stop: Callable[[], bool]
) -> Generated | None:
    """Both models' answers to `examples` and their scores; None when a stop came between two
    answers. Rank 0 answers alone, except under fsdp (`runner`), where every rank does; the
    others return an empty result at once."""
    lockstep = answering.runner is not None
    if not lockstep and not answering.ranks.is_main:
        return Generated()
    started = time.monotonic()
    answers: list[dict[str, Any]] = []
    for example in examples:
        (row,) = samples.answer(
            answering.model,
            answering.head,
            answering.tokenizer,
            [example["prompt"]],
            max_new_tokens=max_new_tokens,
            device=answering.device,
            runner=answering.runner,
        )
        answers.append({**example, "base": row["baseAnswer"], "tuned": row["answer"]})
        world = answering.ranks.world_size if lockstep else 1
        if sum_figures([1.0 if stop() else 0.0], world, answering.device)[0] > 0:
            return None
    references = [a["reference"] for a in answers]
    return Generated(
        answers,
        scores([a["base"] for a in answers], references),
        scores([a["tuned"] for a in answers], references),
        round(time.monotonic() - started, 3),
    )

"""Sample answers after training: greedy, with the adapter and without it, on rank 0's own model.

The prompts are `output.samples.samplePrompts`, else the first `count` of the eval split (of the
training data without one). Each answer runs the trained PEFT model as it is in memory (on the
job's GPU, in the run's precision; no second copy of the base is loaded), once with the adapter
and once with it switched off, so `samples.jsonl` shows what training changed.

The loss head (loss_head.py) stands where the LM head was during training; for generation a
head that returns the last position's logits (the family's logit transform applied) takes its
place and is swapped back after. Decoding is a plain greedy loop without a KV cache: a few
hundred forwards, independent of the checkpointing the model was trained with.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .loop import dropout_off
from .loss_head import LossHead

STATUS_CHARS = 240  # what status.sample holds of a prompt or an answer


class _LastLogits(nn.Module):
    def __init__(self, head: LossHead) -> None:
        super().__init__()
        self.head = head.head
        self.transform = head.transform

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden[:, -1:, :]).float()
        return self.transform(logits) if self.transform is not None else logits


@contextmanager
def _logits_head(model: nn.Module, head: LossHead) -> Iterator[None]:
    base: Any = getattr(model, "get_base_model", lambda: model)()
    base.set_output_embeddings(_LastLogits(head))
    try:
        yield
    finally:
        base.set_output_embeddings(head)


def prompt_of(sample: dict[str, Any], tokenizer: Any) -> str | None:
    """The part of a training sample the model answers: the prompt, or the conversation up to its
    last assistant turn; None for plain text."""
    if isinstance(sample.get("prompt"), str):
        return str(sample["prompt"])
    messages = sample.get("messages")
    if isinstance(messages, list) and messages:
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=len(messages))
        return str(tokenizer.apply_chat_template(messages[:last], tokenize=False, add_generation_prompt=True))
    return None


def choose_prompts(asked: list[str], count: int, pools: list[Any], tokenizer: Any) -> list[str]:
    if asked:
        return asked[: count or len(asked)]
    found: list[str] = []
    for pool in pools:
        for sample in pool or []:
            if len(found) >= count:
                return found
            prompt = prompt_of(dict(sample), tokenizer)
            if prompt:
                found.append(prompt)
    return found


def _greedy(model: nn.Module, ids: list[int], steps: int, eos: int | None, device: torch.device) -> list[int]:
    tokens = torch.tensor([ids], device=device)
    out: list[int] = []
    for _ in range(steps):
        logits = model(input_ids=tokens, use_cache=False).logits[0, -1]
        token = int(logits.argmax())
        if token == eos:
            break
        out.append(token)
        tokens = torch.cat([tokens, torch.tensor([[token]], device=device)], dim=1)
    return out


def answer(
    model: nn.Module, head: LossHead, tokenizer: Any, prompts: list[str], *, max_new_tokens: int, device: torch.device
) -> list[dict[str, str]]:
    """Each prompt's greedy answer with the adapter, and the base's without it."""
    rows = []
    eos = tokenizer.eos_token_id
    with torch.no_grad(), dropout_off(model), _logits_head(model, head):
        for prompt in prompts:
            ids = tokenizer(prompt)["input_ids"]
            tuned = _greedy(model, ids, max_new_tokens, eos, device)
            with model.disable_adapter():  # type: ignore[operator]
                plain = _greedy(model, ids, max_new_tokens, eos, device)
            rows.append(
                {
                    "prompt": prompt,
                    "answer": tokenizer.decode(tuned, skip_special_tokens=True),
                    "baseAnswer": tokenizer.decode(plain, skip_special_tokens=True),
                }
            )
    return rows


def write(path: Path, rows: list[dict[str, str]]) -> Path:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    temp.rename(path)
    return path


def status_sample(rows: list[dict[str, str]], path: Path) -> dict[str, Any]:
    """status.sample: the first prompt and answers, cut to what a `kubectl describe` shows."""
    first = rows[0]

    def cut(text: str) -> str:
        return text if len(text) <= STATUS_CHARS else text[: STATUS_CHARS - 1] + "\u2026"

    return {
        "prompt": cut(first["prompt"]),
        "answer": cut(first["answer"]),
        "baseAnswer": cut(first["baseAnswer"]),
        "path": str(path),
    }

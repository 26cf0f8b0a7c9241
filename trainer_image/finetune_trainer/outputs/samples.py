"""Sample answers after training: greedy, with the adapter and without it.

The prompts are `output.samples.samplePrompts`, else the first `count` of the eval split (of the
training data without one). Each answer runs the trained PEFT model as it is in memory (on the
job's GPU, in the run's precision; no second copy of the base is loaded), once with the adapter
and once with it switched off, so `samples.jsonl` shows what training changed.

The loss head (loss_head.py) stands where the LM head was during training; for generation it
is switched to return the last position's logits (the family's logit transform applied), and
back after. Decoding is a plain greedy loop. Where rank 0 answers alone it keeps transformers'
KV cache: one forward over the prompt, then one one-token forward per new token, with the model
in eval mode for the answer (gradient checkpointing, which acts in training mode only, turns
the cache off) and every module's mode put back after. Under fsdp's lockstep each token is a
forward over the whole row so far, without a cache (below). Both give the same greedy answers
(`tests/trainer/test_evaluation_answers.py`).

Rank 0 answers alone in every mode but fsdp, where it holds a shard of the model: there every
rank runs every forward in lockstep (each forward's all-gathers are collectives), on the same
prompts, and each step's token is rank 0's, broadcast, so all ranks stop at the same step
(what Hugging Face's `generate(synced_gpus=True)` does by running on until every rank is done).
Each fsdp forward runs with gradients on and a zero backward, as the loop's evaluation does: a
no-grad forward of the FSDP1-sharded model gave a wrong eval loss there (loop.Loop.evaluate).
No-grad forwards did give the one process's answers on the two-rank CPU test's tiny model, but
that path is not the one measured against the loss, so the answers take the evaluation's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ..model.dropout import dropout_off, inference
from ..model.loss_head import LossHead, logits_head

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

STATUS_CHARS = 240  # what status.sample holds of a prompt or an answer


def prompt_of(sample: dict[str, Any], tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The part of a training sample the model answers: the prompt, or the conversation up to its
    last assistant turn; None for plain text."""
    if isinstance(sample.get("prompt"), str):
        return str(sample["prompt"])
    if isinstance(sample.get("prompt"), list) and sample["prompt"]:  # a preference pair's conversation
        return str(tokenizer.apply_chat_template(sample["prompt"], tokenize=False, add_generation_prompt=True))
    messages = sample.get("messages")
    if isinstance(messages, list) and messages:
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=len(messages))
        return str(tokenizer.apply_chat_template(messages[:last], tokenize=False, add_generation_prompt=True))
    return None


def choose_prompts(asked: list[str], count: int, pools: list[Any], tokenizer: PreTrainedTokenizerBase) -> list[str]:
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


def _next_logits(model: nn.Module, tokens: torch.Tensor, lockstep: bool) -> torch.Tensor:
    if not lockstep:
        with torch.no_grad():
            last: torch.Tensor = model(input_ids=tokens, use_cache=False).logits[0, -1]
            return last
    # torch 2.7 leaves enable_grad's __init__ unannotated.
    with torch.enable_grad():  # type: ignore[no-untyped-call]
        logits: torch.Tensor = model(input_ids=tokens, use_cache=False).logits
        if logits.requires_grad:  # with the adapter switched off nothing needs a gradient
            # torch 2.7 leaves Tensor.backward unannotated.
            (logits.sum() * 0.0).backward()  # type: ignore[no-untyped-call]
    return logits[0, -1].detach()


def _decoded(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    text = tokenizer.decode(ids, skip_special_tokens=True)
    assert isinstance(text, str)  # one sequence decodes to one string (a batch to a list)
    return text


def _cached_greedy(model: nn.Module, ids: list[int], steps: int, eos: int | None, device: torch.device) -> list[int]:
    """Greedy tokens with transformers' KV cache: the prompt once, then each new token alone."""
    tokens = torch.tensor([ids], device=device)
    past: Any = None
    out: list[int] = []
    with torch.no_grad(), inference(model):
        for _ in range(steps):
            result = model(input_ids=tokens, cache=past, use_cache=True)
            past = result.cache
            token = int(result.logits[0, -1].argmax())
            if token == eos:
                break
            out.append(token)
            tokens = torch.tensor([[token]], device=device)
    return out


def _greedy(
    model: nn.Module,
    ids: list[int],
    steps: int,
    eos: int | None,
    device: torch.device,
    *,
    lockstep: bool = False,
    cached: bool | None = None,
) -> list[int]:
    """Greedy tokens: with the KV cache (`cached`, by default where the rank answers alone), or
    each token a forward over the whole row so far."""
    if cached if cached is not None else not lockstep:
        return _cached_greedy(model, ids, steps, eos, device)
    tokens = torch.tensor([ids], device=device)
    out: list[int] = []
    for _ in range(steps):
        chosen = _next_logits(model, tokens, lockstep).argmax().reshape(1)
        if lockstep:
            dist.broadcast(chosen, src=0)
        token = int(chosen)
        if token == eos:
            break
        out.append(token)
        tokens = torch.cat([tokens, torch.tensor([[token]], device=device)], dim=1)
    return out


def answer(
    model: nn.Module,
    head: LossHead,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    *,
    max_new_tokens: int,
    device: torch.device,
    runner: nn.Module | None = None,
) -> list[dict[str, str]]:
    """Each prompt's greedy answer with the adapter, and the base's without it. `model` is the
    PEFT model; `runner`, when given, is the FSDP module around it that the forwards go through,
    on every rank in lockstep (each rank gets the same rows)."""
    rows = []
    eos = tokenizer.eos_token_id
    lockstep = runner is not None
    forward = runner if runner is not None else model
    try:
        with dropout_off(forward), logits_head(head):
            for prompt in prompts:
                ids = tokenizer(prompt)["input_ids"]
                tuned = _greedy(forward, ids, max_new_tokens, eos, device, lockstep=lockstep)
                # The adapter's model is typed nn.Module, whose attributes read as a Tensor or a
                # Module; this one is PeftModel's context manager.
                with model.disable_adapter():  # type: ignore[operator]
                    plain = _greedy(forward, ids, max_new_tokens, eos, device, lockstep=lockstep)
                rows.append(
                    {
                        "prompt": prompt,
                        "answer": _decoded(tokenizer, tuned),
                        "baseAnswer": _decoded(tokenizer, plain),
                    }
                )
    finally:
        if lockstep:  # the zero backwards' gradients: the adapter is saved already
            for param in model.parameters():
                param.grad = None
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

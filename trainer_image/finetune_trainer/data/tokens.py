"""The one tokenisation rule: how a checked sample becomes tokens and labels.

The trainer's rows (`batches.make_rows`) and the data check's counts (`checks`) both call
`tokenize`, so the check counts exactly the tokens the trainer will train on. A prompt is
tokenised with the tokenizer's special tokens, its completion without them plus EOS, and the
loss is taken on the completion only; text gets EOS and trains on everything; a conversation is
rendered with the model's chat template and trains on what `trainOn` names, the spans read off
the template by `chat.render`. Strings are sent to the tokenizer in chunks (a fast tokenizer
encodes a list at once). Pure Python: the CLI's `check-data` runs it without torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from .chat import DEFAULT_TRAIN_ON, render, special_marks, trained_tokens

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# The label of a token that is not a target of the loss (PyTorch's ignore_index).
IGNORE = -100
# Samples per call of the tokenizer.
CHUNK = 256


class Tokens(NamedTuple):
    input_ids: list[int]
    labels: list[int]  # IGNORE where no loss is taken
    prompt: int  # tokens of the prompt (no loss on them); 0 for text and conversations
    problem: tuple[str, str] | None = None  # (field, message): a conversation the template gives no mask for


def trained(labels: Sequence[int]) -> int:
    """Targets of the loss in a row: labels that are not IGNORE, but the first (no token predicts it)."""
    return sum(1 for label in labels[1:] if label != IGNORE)


def pieces(ids: list[int], labels: list[int], max_length: int, split: bool) -> list[tuple[list[int], list[int]]]:
    """A sample as the trainer's rows hold it: cut at max_length, or split into pieces (packing)."""
    if len(ids) <= max_length:
        return [(ids, labels)]
    if not split:
        return [(ids[:max_length], labels[:max_length])]
    return [(ids[i : i + max_length], labels[i : i + max_length]) for i in range(0, len(ids), max_length)]


def _ids(value: Any) -> list[int]:
    if isinstance(value, dict) or hasattr(value, "keys"):
        value = value["input_ids"]
    return [int(v) for v in value]


def _encode(tokenizer: PreTrainedTokenizerBase, texts: list[str], **options: Any) -> list[list[int]]:
    return [_ids(ids) for ids in tokenizer(texts, **options)["input_ids"]] if texts else []


def _conversations(
    samples: Sequence[Mapping[str, Any]],
    indices: list[int],
    tokenizer: PreTrainedTokenizerBase,
    train_on: str,
    marks: re.Pattern[str] | None,
) -> dict[int, Tokens]:
    rendered = {index: render(samples[index]["messages"], tokenizer, train_on, marks) for index in indices}
    out = {index: Tokens([], [], 0, r.problem) for index, r in rendered.items() if r.problem is not None}
    good = [index for index in indices if index not in out]
    if not good:
        return out
    # The template writes the special tokens (BOS too): none are added here, as transformers does.
    encoded = tokenizer([rendered[i].text for i in good], add_special_tokens=False, return_offsets_mapping=True)
    for index, row, offsets in zip(good, encoded["input_ids"], encoded["offset_mapping"], strict=True):
        ids = [int(v) for v in row]
        hits = trained_tokens(offsets, rendered[index].spans)
        out[index] = Tokens(ids, [t if hit else IGNORE for t, hit in zip(ids, hits, strict=True)], 0)
    return out


def _chunk(
    samples: Sequence[Mapping[str, Any]], tokenizer: PreTrainedTokenizerBase, train_on: str, marks: Any
) -> list[Tokens]:
    eos = tokenizer.eos_token_id
    prompts = [i for i, sample in enumerate(samples) if "prompt" in sample]
    turns = [i for i, sample in enumerate(samples) if "messages" in sample]
    texts = [i for i, sample in enumerate(samples) if "prompt" not in sample and "messages" not in sample]
    out = _conversations(samples, turns, tokenizer, train_on, marks)
    heads = _encode(tokenizer, [samples[i]["prompt"] for i in prompts])
    tails = _encode(tokenizer, [samples[i]["completion"] for i in prompts], add_special_tokens=False)
    for index, head, tail in zip(prompts, heads, tails, strict=True):
        answer = [*tail, eos]
        out[index] = Tokens([*head, *answer], [IGNORE] * len(head) + answer, len(head))
    for index, text in zip(texts, _encode(tokenizer, [samples[i]["text"] for i in texts]), strict=True):
        ids = [*text, eos]
        out[index] = Tokens(ids, list(ids), 0)
    return [out[index] for index in range(len(samples))]


def tokenize(
    samples: Sequence[Mapping[str, Any]], tokenizer: PreTrainedTokenizerBase, train_on: str | None = None
) -> list[Tokens]:
    """The tokens and labels of each sample, in order; `train_on` (spec.dataset.trainOn) picks a
    conversation's targets, assistant when unset."""
    marks = special_marks(tokenizer)
    out: list[Tokens] = []
    for start in range(0, len(samples), CHUNK):
        # Row by row: a `datasets.Dataset` (the trainer's split) slices into columns, not rows.
        rows = [samples[i] for i in range(start, min(start + CHUNK, len(samples)))]
        out.extend(_chunk(rows, tokenizer, train_on or DEFAULT_TRAIN_ON, marks))
    return out

"""The one tokenisation rule: how a checked sample becomes tokens and labels.

The trainer's rows (`batches.make_rows`) and the data check's lengths (`checks`) both call
`tokenize`, so the check counts exactly the tokens the trainer will train on. A prompt is
tokenised with the tokenizer's special tokens, its completion without them plus EOS, and the
loss is taken on the completion only; text gets EOS; conversations go through the chat
template. Strings are sent to the tokenizer in chunks (a fast tokenizer encodes a list at once).
Pure Python: the CLI's `check-data` runs it without torch.
"""

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

# The label of a token that is not a target of the loss (PyTorch's ignore_index).
IGNORE = -100
# Samples per call of the tokenizer.
CHUNK = 256


class Tokens(NamedTuple):
    input_ids: list[int]
    labels: list[int]  # IGNORE where no loss is taken
    prompt: int  # tokens of the prompt (no loss on them); 0 for text and conversations


def _ids(value: Any) -> list[int]:
    if isinstance(value, dict) or hasattr(value, "keys"):
        value = value["input_ids"]
    return [int(v) for v in value]


def _encode(tokenizer: Any, texts: list[str], **options: Any) -> list[list[int]]:
    return [_ids(ids) for ids in tokenizer(texts, **options)["input_ids"]] if texts else []


def _chunk(samples: Sequence[Mapping[str, Any]], tokenizer: Any) -> list[Tokens]:
    eos = tokenizer.eos_token_id
    out: dict[int, Tokens] = {}
    prompts: list[int] = []
    texts: list[int] = []
    for index, sample in enumerate(samples):
        if "messages" in sample:
            ids = _ids(tokenizer.apply_chat_template(sample["messages"], tokenize=True))
            out[index] = Tokens(ids, list(ids), 0)
        elif "prompt" in sample:
            prompts.append(index)
        else:
            texts.append(index)
    heads = _encode(tokenizer, [samples[i]["prompt"] for i in prompts])
    tails = _encode(tokenizer, [samples[i]["completion"] for i in prompts], add_special_tokens=False)
    for index, head, tail in zip(prompts, heads, tails, strict=True):
        answer = [*tail, eos]
        out[index] = Tokens([*head, *answer], [IGNORE] * len(head) + answer, len(head))
    for index, text in zip(texts, _encode(tokenizer, [samples[i]["text"] for i in texts]), strict=True):
        ids = [*text, eos]
        out[index] = Tokens(ids, list(ids), 0)
    return [out[index] for index in range(len(samples))]


def tokenize(samples: Sequence[Mapping[str, Any]], tokenizer: Any) -> list[Tokens]:
    """The tokens and labels of each sample, in order."""
    out: list[Tokens] = []
    for start in range(0, len(samples), CHUNK):
        # Row by row: a `datasets.Dataset` (the trainer's split) slices into columns, not rows.
        rows = [samples[i] for i in range(start, min(start + CHUNK, len(samples)))]
        out.extend(_chunk(rows, tokenizer))
    return out

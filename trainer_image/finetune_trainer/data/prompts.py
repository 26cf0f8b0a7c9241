"""The prompts of `dataset.format: prompt` (GRPO's data) as token ids: the one rule the trainer's
rows and `ftjob check-data` both count by.

A string is tokenised as `completion`'s prompt is (data/tokens.py: with the tokenizer's special
tokens, BOS where it adds one). Messages are rendered with the model's chat template and its
generation prompt, tokenised by the template's own call (`apply_chat_template(tokenize=True)`,
which adds no special tokens: the template writes them), so the completion the model samples
next is the assistant's turn. Pure Python: the CLI's `check-data` runs it without torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["prompt_ids", "prompt_text"]


def _flat(value: Any) -> list[int]:
    """Token ids from what a tokenizer returns: a BatchEncoding or dict (transformers 5 answers
    `apply_chat_template(tokenize=True)` with one), a list, or a batch of one list."""
    if isinstance(value, Mapping) or hasattr(value, "keys"):
        value = value["input_ids"]
    ids = list(value)
    if len(ids) == 1 and isinstance(ids[0], Sequence) and not isinstance(ids[0], str):
        ids = list(ids[0])
    return [int(i) for i in ids]


def prompt_ids(sample: Mapping[str, Any], tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The token ids the model continues from: a checked sample's `prompt` (module docstring).
    A template that refuses the messages raises as transformers does (jinja2's TemplateError,
    ValueError); the data check has named such a record before training starts."""
    prompt = sample["prompt"]
    if isinstance(prompt, str):
        return _flat(tokenizer(prompt)["input_ids"])
    rendered = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True)
    return _flat(rendered)


def prompt_text(sample: Mapping[str, Any], tokenizer: PreTrainedTokenizerBase) -> str:
    """The prompt as text, for what is written beside the completions: the string, or the
    messages rendered with the generation prompt."""
    prompt = sample["prompt"]
    if isinstance(prompt, str):
        return prompt
    return str(tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False))

"""Preference pairs (`dataset.format: preference`) as the trainer and the data check see them.

A checked record (`formats._preference`) is split into two SFT samples of the same prompt, one
per answer, each tokenised by the one rule (`tokens.tokenize`): strings as `completion` (the
prompt with the tokenizer's special tokens, the answer without them and with EOS), messages
rendered with the model's chat template with the loss on the last assistant turn. So the prompt
is masked in both and the answers are what is scored. Pure Python, like `tokens`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from .tokens import Tokens, tokenize

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# The prompt is masked: the answer, which is the last assistant turn, is all that is scored.
ANSWER_ONLY = "lastAssistant"
SIDES = ("chosen", "rejected")


class PairTokens(NamedTuple):
    chosen: Tokens
    rejected: Tokens


def side(sample: Mapping[str, Any], which: str) -> dict[str, Any]:
    """One answer of a pair as the SFT sample it is scored like."""
    prompt, answer = sample["prompt"], sample[which]
    if isinstance(prompt, str):
        return {"prompt": prompt, "completion": answer}
    return {"messages": [*prompt, *answer]}


def tokenize_pairs(samples: Sequence[Mapping[str, Any]], tokenizer: PreTrainedTokenizerBase) -> list[PairTokens]:
    """Each checked pair's two sequences, tokenised as the trainer trains on them."""
    rows = [samples[i] for i in range(len(samples))]
    chosen = tokenize([side(s, "chosen") for s in rows], tokenizer, ANSWER_ONLY)
    rejected = tokenize([side(s, "rejected") for s in rows], tokenizer, ANSWER_ONLY)
    return [PairTokens(c, r) for c, r in zip(chosen, rejected, strict=True)]

"""The preference dataset format DPO and ORPO read, and what the two share.

A record is `{"prompt", "chosen", "rejected"}`: the prompt a string or a list of messages
(role/content), chosen and rejected each a string or an assistant message (an object, or a list
ending with one). Strings are tokenised as `completion` is (the prompt with the tokenizer's
special tokens, each answer without them plus EOS); messages are rendered with the model's chat
template as in SFT, the answer being the last assistant turn. Only the answers are scored: the
prompt is masked.
"""

from __future__ import annotations

from typing import Final

PREFERENCE: Final = "preference"
FORMATS: Final[dict[str, str]] = {
    PREFERENCE: "prompt/chosen/rejected: a string or messages each, rendered with the model's chat template",
}
# The pair's sequences, in the order a micro-batch holds them (TRL's): the trainer can run each
# side as a micro-batch of its own when the planner says memory needs it.
SEQUENCE_NAMES: Final = ("chosen", "rejected")
# A row of preference data is a pair: its chosen and its rejected answer each go through the model.
SEQUENCES_PER_ROW: Final = len(SEQUENCE_NAMES)

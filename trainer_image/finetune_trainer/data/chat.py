"""Which characters of a conversation are trained, read off the model's own chat template.

The one place the loss mask of a `messages` or `sharegpt` sample is decided; the trainer's rows
and `ftjob check-data` both reach it through `tokens.tokenize`.

The template is rendered prefix by prefix. Up to an assistant turn with the generation prompt
is what the model reads before it writes; up to and with that turn adds what it writes. The
difference is the turn's text as the template spells it (a `{% generation %}` marker is not
needed), trained up to and including the last special token in it: the end-of-turn token, so
the model learns to stop (Llama 3's `<|eot_id|>`, ChatML's `<|im_end|>`, Mistral's `</s>`,
Gemma's `<end_of_turn>`); what the template writes after that token (ChatML's newline) is the
next turn's opening and is not trained.

Every such render must be the start of the whole conversation's render. A template that
rewrites earlier turns (one that drops earlier reasoning blocks, one that moves the system
prompt into the last user turn) breaks that, and no mask read from it could be trusted: the
sample gets a `chat_template` problem instead, which stops the check and the trainer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from finetune_api.spec import DEFAULT_TRAIN_ON

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["DEFAULT_TRAIN_ON", "TEMPLATE_FIELD", "Rendered", "render", "special_marks", "trained_tokens"]

# The field of a problem that is the template's, not the sample's: it is reported once.
TEMPLATE_FIELD = "chat_template"


class Rendered(NamedTuple):
    text: str
    spans: list[tuple[int, int]]  # [start, end) characters of `text` that are trained
    problem: tuple[str, str] | None  # (field, message) when no mask can be read


def special_marks(tokenizer: PreTrainedTokenizerBase) -> re.Pattern[str] | None:
    """A pattern for the tokenizer's special tokens (an end-of-turn token is one of them)."""
    names = set(getattr(tokenizer, "all_special_tokens", None) or [])
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    names |= {str(token.content) for token in added.values() if getattr(token, "special", False)}
    names.discard("")
    if not names:
        return None
    return re.compile("|".join(re.escape(name) for name in sorted(names, key=len, reverse=True)))


def _render(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, str]], prompt: bool) -> str:
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=prompt)
    return str(text)


def _written(region: str, marks: re.Pattern[str] | None) -> int:
    """How much of an assistant turn's text is the model's to write: through its last special token."""
    last = None
    if marks is not None:
        for last in marks.finditer(region):  # noqa: B007 - the last match is the one wanted
            pass
    if last is not None:
        return last.end()
    return len(region.rstrip())


def _not_kept(index: int, turn: int) -> tuple[str, str]:
    return (
        TEMPLATE_FIELD,
        f"the model's chat template does not keep prefixes: the conversation rendered up to messages[{index}] "
        f"(assistant turn {turn}) is not the start of the whole conversation's render, so the template rewrites "
        "earlier turns (as templates that drop earlier reasoning blocks do) and the assistant's tokens cannot be "
        "found; use a template that keeps earlier turns as written, or dataset.trainOn: all",
    )


def _span(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict[str, str]],
    index: int,
    *,
    turn: int,
    whole: str,
    marks: re.Pattern[str] | None,
) -> tuple[int, int] | tuple[str, str]:
    """The trained characters of the assistant turn at `index`, or the template's problem."""
    with_turn = _render(tokenizer, messages[: index + 1], prompt=False)
    if not whole.startswith(with_turn):
        return _not_kept(index, turn)
    before = _render(tokenizer, messages[:index], prompt=True) if index else ""
    if not with_turn.startswith(before):
        # A generation prompt the turn does not start with: then the turn starts after the last one.
        before = _render(tokenizer, messages[:index], prompt=False)
        if not with_turn.startswith(before):
            return _not_kept(index, turn)
    start = len(before)
    return (start, start + _written(with_turn[start:], marks))


def render(
    messages: Sequence[dict[str, str]], tokenizer: PreTrainedTokenizerBase, train_on: str, marks: re.Pattern[str] | None
) -> Rendered:
    """The conversation as the template writes it, and the characters trained under `train_on`."""
    from jinja2 import TemplateError

    try:
        whole = _render(tokenizer, messages, prompt=False)
        if train_on == "all":
            return Rendered(whole, [(0, len(whole))], None)
        turns = [i for i, message in enumerate(messages) if message["role"] == "assistant"]
        chosen = turns[-1:] if train_on == "lastAssistant" else turns
        spans: list[tuple[int, int]] = []
        for index in chosen:
            found = _span(tokenizer, messages, index, turn=turns.index(index) + 1, whole=whole, marks=marks)
            if isinstance(found[0], str):
                return Rendered(whole, [], (str(found[0]), str(found[1])))
            spans.append((int(found[0]), int(found[1])))
    except (TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
        # raise_exception() in a template (Gemma refuses a system turn) and templates that index
        # past the turns they were given both end here: the sample's problem, in one line.
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return Rendered("", [], ("messages", f"the model's chat template refused this conversation: {first}"))
    return Rendered(whole, spans, None)


def trained_tokens(offsets: Sequence[Sequence[int]], spans: list[tuple[int, int]]) -> list[bool]:
    """For each token (its character offsets), whether it overlaps a trained span."""
    out: list[bool] = []
    for start, end in offsets:
        # A zero-width token (one the tokenizer inserted) is trained where it sits inside a span.
        hit = any(a <= start < b if start == end else start < b and end > a for a, b in spans)
        out.append(hit)
    return out

"""The dataset formats of the API (every objective's: finetune_api.objectives.dataset_formats), each
turned into one of TRL's shapes.

alpaca and completion become prompt/completion (loss on the answer only); sharegpt and
messages become conversations rendered with the model's chat template; text stays text;
preference becomes a pair; prompt stays the record, its prompt checked (GRPO samples the rest).
Every field problem is returned as (field, message), never raised, so the check pass can
list all of them in one go.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# A compact Alpaca prompt: the classic preamble costs ~40 tokens per sample for no gain.
ALPACA_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
ALPACA_PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"

SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
}
MESSAGE_ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Normalised:
    sample: dict[str, Any] | None
    problems: list[tuple[str, str]] = field(default_factory=list)
    strings: dict[str, str] = field(default_factory=dict)  # field path -> text, for token checks


def _bad_text(text: str) -> str | None:
    if not text.strip():
        return "empty text"
    if "\x00" in text:
        return f"NUL character at position {text.index(chr(0)) + 1}"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"invalid unicode (lone surrogate) at position {exc.start + 1}"
    return None


class _Reader:
    def __init__(self, record: Any) -> None:
        self.record = record
        self.out = Normalised(sample=None)

    def text(
        self, name: str, *, required: bool = True, allow_empty: bool = False, source: Any = None, path: str = ""
    ) -> str | None:
        container = self.record if source is None else source
        where = path or name
        if not isinstance(container, dict) or name not in container or container[name] is None:
            if required:
                self.out.problems.append((where, "missing field"))
            return None
        value = container[name]
        if not isinstance(value, str):
            self.out.problems.append((where, f"expected a string, got {type(value).__name__}"))
            return None
        if allow_empty and value == "":
            return value
        bad = _bad_text(value)
        if bad:
            self.out.problems.append((where, bad))
            return None
        self.out.strings[where] = value
        return value

    def list_of_dicts(self, name: str) -> list[dict[str, Any]] | None:
        if not isinstance(self.record, dict) or name not in self.record:
            self.out.problems.append((name, "missing field"))
            return None
        value = self.record[name]
        if not isinstance(value, list) or not value:
            self.out.problems.append((name, "expected a non-empty list of turns"))
            return None
        for index, turn in enumerate(value):
            if not isinstance(turn, dict):
                self.out.problems.append((f"{name}[{index}]", "expected an object"))
                return None
        return value


def _alpaca(r: _Reader) -> dict[str, Any] | None:
    instruction = r.text("instruction")
    extra = r.text("input", required=False, allow_empty=True)
    output = r.text("output")
    if instruction is None or output is None:
        return None
    prompt = (ALPACA_PROMPT_WITH_INPUT if extra else ALPACA_PROMPT).format(instruction=instruction, input=extra)
    return {"prompt": prompt, "completion": output}


def _completion(r: _Reader) -> dict[str, Any] | None:
    prompt = r.text("prompt")
    completion = r.text("completion")
    if prompt is None or completion is None:
        return None
    return {"prompt": prompt, "completion": completion}


def _text(r: _Reader) -> dict[str, Any] | None:
    text = r.text("text")
    return None if text is None else {"text": text}


def _turns(r: _Reader, name: str, role_key: str, text_key: str, roles: dict[str, str]) -> dict[str, Any] | None:
    turns = r.list_of_dicts(name)
    if turns is None:
        return None
    messages: list[dict[str, str]] = []
    for index, turn in enumerate(turns):
        where = f"{name}[{index}]"
        role = turn.get(role_key)
        if not isinstance(role, str) or role.lower() not in roles:
            allowed = ", ".join(sorted(set(roles)))
            r.out.problems.append((f"{where}.{role_key}", f"expected one of {allowed}, got {role!r}"))
            continue
        content = r.text(text_key, source=turn, path=f"{where}.{text_key}")
        if content is not None:
            messages.append({"role": roles[role.lower()], "content": content})
    if r.out.problems:
        return None
    if not any(m["role"] == "assistant" for m in messages):
        r.out.problems.append((name, "no assistant turn: nothing to learn from"))
        return None
    return {"messages": messages}


def _sharegpt(r: _Reader) -> dict[str, Any] | None:
    return _turns(r, "conversations", "from", "value", SHAREGPT_ROLES)


def _messages(r: _Reader) -> dict[str, Any] | None:
    return _turns(r, "messages", "role", "content", {role: role for role in MESSAGE_ROLES})


def _message_list(r: _Reader, name: str, value: Any) -> list[dict[str, str]] | None:
    """Messages (role/content) under `name`, or None with the problem noted."""
    if not isinstance(value, list) or not value:
        got = "an empty list" if isinstance(value, list) else type(value).__name__
        r.out.problems.append((name, f"expected a string or a non-empty list of messages, got {got}"))
        return None
    messages: list[dict[str, str]] = []
    for index, turn in enumerate(value):
        where = f"{name}[{index}]"
        if not isinstance(turn, dict):
            r.out.problems.append((where, "expected an object"))
            return None
        role = turn.get("role")
        if role not in MESSAGE_ROLES:
            r.out.problems.append(
                (f"{where}.role", f"expected one of {', '.join(sorted(MESSAGE_ROLES))}, got {role!r}")
            )
            return None
        content = r.text("content", source=turn, path=f"{where}.content")
        if content is None:
            return None
        messages.append({"role": role, "content": content})
    return messages


def _answer(r: _Reader, name: str) -> str | list[dict[str, str]] | None:
    """An answer of a pair: a string, or the assistant turn that ends its messages (an object or
    a list); the turns before that one join the prompt."""
    value = r.record.get(name)
    if value is None:
        r.out.problems.append((name, "missing field"))
        return None
    if isinstance(value, str):
        return r.text(name)
    messages = _message_list(r, name, [value] if isinstance(value, dict) else value)
    if messages is None:
        return None
    if messages[-1]["role"] != "assistant":
        r.out.problems.append((name, "the last message must be the assistant's answer"))
        return None
    return messages


def pair_shape(value: Any) -> str:
    """`strings` or `messages`: how a pair's fields are written (a checked pair is one or the other)."""
    return "a string" if isinstance(value, str) else "messages"


def _preference(r: _Reader) -> dict[str, Any] | None:
    raw = r.record.get("prompt")
    prompt: str | list[dict[str, str]] | None
    if raw is None:
        r.out.problems.append(("prompt", "missing field"))
        prompt = None
    elif isinstance(raw, str):
        prompt = r.text("prompt")
    else:
        prompt = _message_list(r, "prompt", raw)
    chosen, rejected = _answer(r, "chosen"), _answer(r, "rejected")
    if prompt is None or chosen is None or rejected is None:
        return None
    shape = pair_shape(prompt)
    for name, answer in (("chosen", chosen), ("rejected", rejected)):
        if pair_shape(answer) != shape:
            # One rule renders a pair: the chat template for messages, `completion`'s for strings.
            r.out.problems.append(
                (name, f"{pair_shape(answer)}, but prompt is {shape}: a pair is all strings or all messages")
            )
            return None
    if chosen == rejected:
        r.out.problems.append(("rejected", "the same as chosen: nothing to prefer"))
        return None
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


# The turns a prompt may end with: the completion sampled for it is the assistant's answer to it.
PROMPT_ENDS = ("user", "tool")


def _prompt(r: _Reader) -> dict[str, Any] | None:
    """A prompt to sample completions for (GRPO): a string, or messages ending with the turn
    the completion answers; every other field of the record is kept as it is, for the rewards."""
    raw = r.record.get("prompt")
    prompt: str | list[dict[str, str]] | None
    if raw is None:
        r.out.problems.append(("prompt", "missing field"))
        return None
    if isinstance(raw, str):
        prompt = r.text("prompt")
    else:
        prompt = _message_list(r, "prompt", raw)
        if prompt is not None and prompt[-1]["role"] not in PROMPT_ENDS:
            r.out.problems.append(
                (
                    "prompt",
                    f"the last message is the {prompt[-1]['role']}'s: a prompt ends with the turn its completion "
                    f"answers ({' or '.join(PROMPT_ENDS)})",
                )
            )
            return None
    if prompt is None:
        return None
    return {**r.record, "prompt": prompt}


# One parser per format of the API's objectives (finetune_api.objectives.dataset_formats), by its name.
PARSERS: dict[str, Callable[[_Reader], dict[str, Any] | None]] = {
    "alpaca": _alpaca,
    "sharegpt": _sharegpt,
    "messages": _messages,
    "text": _text,
    "completion": _completion,
    "preference": _preference,
    "prompt": _prompt,
}


def normalise(record: Any, fmt: str) -> Normalised:
    """One record in `fmt` to a TRL sample, or the list of its field problems."""
    reader = _Reader(record)
    if not isinstance(record, dict):
        reader.out.problems.append(("", f"expected a JSON object, got {type(record).__name__}"))
        return reader.out
    parse = PARSERS.get(fmt)
    if parse is None:
        raise ValueError(f"unknown dataset format {fmt!r}")
    sample = parse(reader)
    reader.out.sample = None if reader.out.problems else sample
    return reader.out

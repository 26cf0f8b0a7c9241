"""Hypothesis strategies for training-data files with bad lines planted at known places.

A `DataCase` is a JSON Lines file (as bytes) in one of the five formats, plus the line numbers
that are broken on purpose: invalid JSON, NUL bytes, invalid UTF-8, missing or mistyped fields,
empty text, a `\\u0000` or lone surrogate inside a string, a record that is not an object. A
correct checker reports every one of those lines by number; whatever else it reports must still
name a line.
"""

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

FORMATS = ("alpaca", "sharegpt", "messages", "text", "completion")

# Text that is fine for training: something besides whitespace, no NUL.
GOOD_TEXT = st.text(min_size=1, max_size=200).filter(lambda s: s.strip() and "\x00" not in s)


@dataclass(frozen=True)
class DataCase:
    fmt: str
    lines: tuple[bytes, ...]
    bad: frozenset[int]  # 1-based line numbers broken on purpose
    kinds: tuple[str, ...]

    def content(self) -> bytes:
        return b"\n".join(self.lines) + b"\n"


def _dump(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


@st.composite
def good_record(draw: st.DrawFn, fmt: str) -> dict[str, Any]:
    if fmt == "alpaca":
        record = {"instruction": draw(GOOD_TEXT), "output": draw(GOOD_TEXT)}
        if draw(st.booleans()):
            record["input"] = draw(st.one_of(st.just(""), GOOD_TEXT))
        return record
    if fmt == "completion":
        return {"prompt": draw(GOOD_TEXT), "completion": draw(GOOD_TEXT)}
    if fmt == "text":
        return {"text": draw(GOOD_TEXT)}
    if fmt == "sharegpt":
        return {
            "conversations": [{"from": "human", "value": draw(GOOD_TEXT)}, {"from": "gpt", "value": draw(GOOD_TEXT)}]
        }
    return {
        "messages": [{"role": "user", "content": draw(GOOD_TEXT)}, {"role": "assistant", "content": draw(GOOD_TEXT)}]
    }


def _text_fields(fmt: str) -> list[tuple[str, ...]]:
    """Paths of the required text fields of a format's record."""
    return {
        "alpaca": [("instruction",), ("output",)],
        "completion": [("prompt",), ("completion",)],
        "text": [("text",)],
        "sharegpt": [("conversations", "0", "value"), ("conversations", "1", "value")],
        "messages": [("messages", "0", "content"), ("messages", "1", "content")],
    }[fmt]


def _replace(record: Any, path: tuple[str, ...], value: Any, *, delete: bool = False) -> None:
    node = record
    for key in path[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value


BAD_KINDS = (
    "invalid-json",
    "nul-byte",
    "invalid-utf8",
    "missing-field",
    "wrong-type",
    "empty-text",
    "escaped-nul",
    "lone-surrogate",
    "not-an-object",
)


@st.composite
def bad_line(draw: st.DrawFn, fmt: str) -> tuple[bytes, str]:
    kind = draw(st.sampled_from(BAD_KINDS))
    record = draw(good_record(fmt))
    path = draw(st.sampled_from(_text_fields(fmt)))
    if kind == "invalid-json":
        text = _dump(record)
        return text[: draw(st.integers(1, max(1, len(text) - 1)))], kind
    if kind == "nul-byte":
        text = _dump(record)
        at = draw(st.integers(0, len(text)))
        return text[:at] + b"\x00" + text[at:], kind
    if kind == "invalid-utf8":
        text = _dump(record)
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(
            st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"])
        ) + text[at:], kind
    if kind == "missing-field":
        _replace(record, path, None, delete=True)
        return _dump(record), kind
    if kind == "wrong-type":
        _replace(record, path, draw(st.one_of(st.integers(), st.lists(st.integers(), max_size=2), st.booleans())))
        return _dump(record), kind
    if kind == "empty-text":
        _replace(record, path, draw(st.sampled_from(["", " ", "\n\t ", "\u3000"])))
        return _dump(record), kind
    if kind == "escaped-nul":
        _replace(record, path, "before\x00after")
        return json.dumps(record).encode(), kind
    if kind == "lone-surrogate":
        # Valid JSON, but "\ud800" decodes to a lone surrogate: not encodable, poison for tokenizers.
        _replace(record, path, "PLACEHOLDER")
        return json.dumps(record).replace("PLACEHOLDER", "x\\ud800y").encode(), kind
    return _dump(draw(st.one_of(st.lists(st.integers(), max_size=3), st.integers(), st.text(max_size=10)))), kind


@st.composite
def data_cases(draw: st.DrawFn, max_lines: int = 40) -> DataCase:
    fmt = draw(st.sampled_from(FORMATS))
    count = draw(st.integers(1, max_lines))
    lines: list[bytes] = []
    bad: set[int] = set()
    kinds: list[str] = []
    for number in range(1, count + 1):
        if draw(st.integers(0, 3)) == 0:
            line, kind = draw(bad_line(fmt))
            bad.add(number)
            kinds.append(kind)
        else:
            line = _dump(draw(good_record(fmt)))
        lines.append(line)
    if draw(st.booleans()) and lines:
        # A blank line is skipped, not an error, and must not shift the numbering.
        lines.insert(0, b"")
        bad = {n + 1 for n in bad}
    return DataCase(fmt, tuple(lines), frozenset(bad), tuple(kinds))

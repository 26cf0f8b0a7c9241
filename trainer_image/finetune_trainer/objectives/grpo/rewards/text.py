"""The rewards computed from a completion's text: `answer`, `format` and `length`.

- `answer`: 1 where the completion's answer equals the record's `field`, both trimmed of white
  space at their ends, else 0. The completion's answer is the first match of `pattern`
  (`re.search`, no flags: write `(?s)` for `.` to cross lines), its first group where the pattern
  has groups, else the whole match; no match (or a first group that took no part) is 0. Without
  a pattern the whole completion is the answer. The record's value is a string or an integer
  (an integer as Python writes it: `42`); any other value fails the reward.
- `format`: 1 where `pattern` matches anywhere in the completion (`re.search` with `re.DOTALL`,
  so `.` crosses lines and `^` is the completion's start), else 0.
- `length`: with n the completion's length in tokens, `max(-1, -|n - target| / target)`: 0 at
  the target, falling linearly to -1 at a distance of `target` tokens either way, -1 beyond.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .base import Completions, Record, RewardError


def answer_of(completion: str, pattern: re.Pattern[str] | None) -> str | None:
    """The completion's answer as `answer` reads it, trimmed, or None where the pattern finds none."""
    if pattern is None:
        return completion.strip()
    found = pattern.search(completion)
    if found is None:
        return None
    value = found.group(1) if pattern.groups else found.group(0)
    return None if value is None else value.strip()


def expected_answer(record: Record, field: str, index: int) -> str:
    """The record's `field` as text, trimmed; a missing field or another type is the reward's error."""
    if field not in record:
        raise RewardError(f"completion {index}: its record has no field '{field}'")
    value = record[field]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise RewardError(
            f"completion {index}: its record's '{field}' is {type(value).__name__}, not a string or an integer"
        )
    return str(value).strip()


@dataclass(frozen=True)
class AnswerReward:
    name: str
    weight: float
    field: str
    pattern: re.Pattern[str] | None = None

    def score(self, batch: Completions) -> Sequence[float]:
        scores = []
        for index, (completion, record) in enumerate(zip(batch.completions, batch.records, strict=True)):
            expected = expected_answer(record, self.field, index)
            scores.append(1.0 if answer_of(completion, self.pattern) == expected else 0.0)
        return scores


@dataclass(frozen=True)
class FormatReward:
    name: str
    weight: float
    # Compiled with re.DOTALL (parsing.py), which `format` promises.
    pattern: re.Pattern[str]

    def score(self, batch: Completions) -> Sequence[float]:
        return [1.0 if self.pattern.search(completion) else 0.0 for completion in batch.completions]


def length_penalty(tokens: int, target: int) -> float:
    """`length`'s value for a completion of `tokens` tokens: in [-1, 0], 0 at the target."""
    return max(-1.0, -abs(tokens - target) / target)


@dataclass(frozen=True)
class LengthReward:
    name: str
    weight: float
    target: int

    def score(self, batch: Completions) -> Sequence[float]:
        scores = []
        for index, completion in enumerate(batch.completions):
            tokens = batch.count_tokens(completion)
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
                raise RewardError(f"completion {index}: the token count is {tokens!r}, not a count")
            scores.append(length_penalty(tokens, self.target))
        return scores

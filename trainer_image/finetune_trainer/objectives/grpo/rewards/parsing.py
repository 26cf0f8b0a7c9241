"""The rewards' settings (`training.grpo.rewards`, a list in the spec's YAML shape) as rewards.

Each entry is `{name, weight, <kind>: {...}}` with exactly one kind:

    answer: {field: <record field>, pattern: <regular expression>}   pattern optional
    format: {pattern: <regular expression>}
    length: {target: <tokens, an integer >= 1>}
    http:   {url: <http:// or https:// URL>, timeoutSeconds: 30, batchSize: 64}

`name` (letters, digits, `.`, `_`, `-`; unique) is what the reward's figures and failures are
called by; `weight` (any finite number, default 1.0, as TRL's `reward_weights`) multiplies it in
the weighted sum. Every problem is one line naming the field by its path, e.g.
`spec.training.grpo.rewards[1].format.pattern: not a regular expression: ...`.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from .base import Reward, RewardSettingsInvalid
from .remote import DEFAULT_BATCH_SIZE, DEFAULT_TIMEOUT_SECONDS, HttpReward
from .text import AnswerReward, FormatReward, LengthReward

WHERE: Final = "spec.training.grpo.rewards"
# A reward's name becomes a TensorBoard tag (`rewards/<name>/mean`) and a word in status lines.
NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
# Each kind's fields: the required ones, then the optional ones.
FIELDS: Final[Mapping[str, tuple[frozenset[str], frozenset[str]]]] = {
    "answer": (frozenset({"field"}), frozenset({"pattern"})),
    "format": (frozenset({"pattern"}), frozenset()),
    "length": (frozenset({"target"}), frozenset()),
    "http": (frozenset({"url"}), frozenset({"timeoutSeconds", "batchSize"})),
}
ENTRY_FIELDS: Final = frozenset({"name", "weight"})


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise RewardSettingsInvalid(where, f"expected a mapping, got {type(value).__name__}")
    return value


def _fields(block: Mapping[str, Any], required: frozenset[str], optional: frozenset[str], where: str) -> None:
    unknown = sorted(set(block) - required - optional)
    if unknown:
        raise RewardSettingsInvalid(
            f"{where}.{unknown[0]}", f"not a field here (fields: {', '.join(sorted(required | optional))})"
        )
    missing = sorted(required - set(block))
    if missing:
        raise RewardSettingsInvalid(f"{where}.{missing[0]}", "required")


def _text(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RewardSettingsInvalid(where, f"expected a non-empty string, got {value!r}")
    return value


def _regex(value: object, where: str, flags: int = 0) -> re.Pattern[str]:
    try:
        return re.compile(_text(value, where), flags)
    except re.error as exc:
        raise RewardSettingsInvalid(where, f"not a regular expression: {exc}") from None


def _number(value: object, where: str, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RewardSettingsInvalid(where, f"expected a finite number, got {value!r}")
    if positive and value <= 0:
        raise RewardSettingsInvalid(where, f"must be greater than 0, got {value!r}")
    return float(value)


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RewardSettingsInvalid(where, f"expected an integer of at least 1, got {value!r}")
    return value


def _url(value: object, where: str) -> str:
    url = _text(value, where)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RewardSettingsInvalid(where, f"expected an http:// or https:// URL with a host, got {url!r}")
    return url


def _answer(name: str, weight: float, block: Mapping[str, Any], where: str) -> Reward:
    pattern = _regex(block["pattern"], f"{where}.pattern") if "pattern" in block else None
    return AnswerReward(name, weight, _text(block["field"], f"{where}.field"), pattern)


def _format(name: str, weight: float, block: Mapping[str, Any], where: str) -> Reward:
    return FormatReward(name, weight, _regex(block["pattern"], f"{where}.pattern", re.DOTALL))


def _length(name: str, weight: float, block: Mapping[str, Any], where: str) -> Reward:
    return LengthReward(name, weight, _count(block["target"], f"{where}.target"))


def _http(name: str, weight: float, block: Mapping[str, Any], where: str) -> Reward:
    timeout = block.get("timeoutSeconds", DEFAULT_TIMEOUT_SECONDS)
    return HttpReward(
        name,
        weight,
        _url(block["url"], f"{where}.url"),
        _number(timeout, f"{where}.timeoutSeconds", positive=True),
        _count(block.get("batchSize", DEFAULT_BATCH_SIZE), f"{where}.batchSize"),
    )


KINDS: Final[Mapping[str, Callable[[str, float, Mapping[str, Any], str], Reward]]] = {
    "answer": _answer,
    "format": _format,
    "length": _length,
    "http": _http,
}


def parse_reward(entry: object, where: str) -> Reward:
    """One entry of the list (`where` its path, `...rewards[i]`) as its reward."""
    item = _mapping(entry, where)
    _fields(item, frozenset({"name"}), ENTRY_FIELDS | set(KINDS), where)
    name = _text(item["name"], f"{where}.name")
    if not NAME.fullmatch(name):
        raise RewardSettingsInvalid(
            f"{where}.name", f"{name!r}: letters, digits, '.', '_' and '-', starting with a letter or digit, at most 63"
        )
    weight = _number(item.get("weight", 1.0), f"{where}.weight")
    kinds = [kind for kind in KINDS if kind in item]
    if len(kinds) != 1:
        said = ", ".join(kinds) if kinds else "none"
        raise RewardSettingsInvalid(where, f"needs exactly one of {', '.join(KINDS)} (has {said})")
    kind = kinds[0]
    block = _mapping(item[kind], f"{where}.{kind}")
    _fields(block, *FIELDS[kind], f"{where}.{kind}")
    return KINDS[kind](name, weight, block, f"{where}.{kind}")


def parse_rewards(entries: object, where: str = WHERE) -> tuple[Reward, ...]:
    """The rewards a spec's list names, in its order; at least one, their names unique."""
    if not isinstance(entries, Sequence) or isinstance(entries, str | bytes):
        raise RewardSettingsInvalid(where, f"expected a list of rewards, got {type(entries).__name__}")
    if not entries:
        raise RewardSettingsInvalid(where, "needs at least one reward: GRPO learns from nothing else")
    rewards = tuple(parse_reward(entry, f"{where}[{index}]") for index, entry in enumerate(entries))
    seen: set[str] = set()
    for index, reward in enumerate(rewards):
        if reward.name in seen:
            raise RewardSettingsInvalid(f"{where}[{index}].name", f"{reward.name!r} names another reward already")
        seen.add(reward.name)
    return rewards

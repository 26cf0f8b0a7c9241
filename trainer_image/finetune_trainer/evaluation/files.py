"""evaluation.json beside the adapter: the base-against-tuned table, per-example values, the
greedy answers, the seconds each part took and the tuned figures at checkpoints. Written
atomically (a temporary file, fsync, rename) by rank 0 after each measure, so a later attempt
reads the base's figures back instead of measuring them again.

The schema (version 1):

    {"version": 1, "method": "sft", "step": 120, "examples": 24, "split": "evalFraction",
     "figures": [{"name": "loss", "base": 2.31, "tuned": 1.05, "better": "lower"}, ...],
     "perExample": [{"index": 0, "base": 2.4, "tuned": 1.0}, ...],
     "answers": [{"index": 3, "prompt": "...", "reference": "...", "base": "...", "tuned": "..."}],
     "seconds": {"base": 3.2, "tuned": 3.1, "generation": 10.0},
     "history": [{"step": 50, "figures": {"loss": 1.5, "perplexity": 4.5}}]}

A figure may be null on one side (a reward of the base; a perplexity past a float).
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

log = logging.getLogger(__name__)

VERSION: Final = 1
# The table's order, and which way is better; a figure not named here follows, higher better.
ORDER: Final = (
    "loss",
    "perplexity",
    "preferenceAccuracy",
    "rewardAccuracy",
    "rewardMargin",
    "rougeL",
    "chrF",
    "bleu",
    "exactMatch",
)
LOWER_BETTER: Final = frozenset({"loss", "perplexity"})
Figures = dict[str, float | None]


def finite(value: float | None) -> float | None:
    """JSON has no NaN or infinity: a value past a float is null."""
    return value if value is not None and math.isfinite(value) else None


@dataclass
class Record:
    """What evaluation.json holds, as the stages fill it in."""

    method: str
    split: str
    examples: int
    step: int = 0
    base: Figures = field(default_factory=dict)
    tuned: Figures = field(default_factory=dict)
    base_examples: dict[int, float] = field(default_factory=dict)
    tuned_examples: dict[int, float] = field(default_factory=dict)
    answers: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)

    def names(self) -> list[str]:
        found = [n for n in (*self.base, *self.tuned) if self.base.get(n) is not None or self.tuned.get(n) is not None]
        known = [n for n in ORDER if n in found]
        return known + [n for n in dict.fromkeys(found) if n not in ORDER]

    def figures(self) -> list[dict[str, Any]]:
        return [
            {
                "name": name,
                "base": finite(self.base.get(name)),
                "tuned": finite(self.tuned.get(name)),
                "better": "lower" if name in LOWER_BETTER else "higher",
            }
            for name in self.names()
        ]

    def document(self) -> dict[str, Any]:
        indices = sorted({*self.base_examples, *self.tuned_examples})
        return {
            "version": VERSION,
            "method": self.method,
            "step": self.step,
            "examples": self.examples,
            "split": self.split,
            "figures": self.figures(),
            "perExample": [
                {"index": i, "base": finite(self.base_examples.get(i)), "tuned": finite(self.tuned_examples.get(i))}
                for i in indices
            ],
            "answers": self.answers,
            "seconds": self.seconds,
            "history": self.history,
        }

    def add_history(self, step: int, figures: Figures) -> None:
        """The tuned figures at `step`, in step order, replacing an earlier attempt's at that step."""
        kept = [h for h in self.history if h["step"] != step]
        kept.append({"step": step, "figures": {k: finite(v) for k, v in figures.items() if finite(v) is not None}})
        self.history = sorted(kept, key=lambda h: int(h["step"]))


def status_of(record: Record) -> dict[str, Any]:
    """status.evaluation: the step, both models' figures (numbers only) and one short line."""

    def numbers(figures: Figures) -> dict[str, float]:
        return {name: round(v, 6) for name, value in figures.items() if (v := finite(value)) is not None}

    base, tuned = numbers(record.base), numbers(record.tuned)
    first = next((name for name in record.names() if name in base or name in tuned), None)
    summary = None
    if first is not None and first in base and first in tuned:
        summary = f"{first} {base[first]:.3g} -> {tuned[first]:.3g}"
    elif first is not None:
        summary = f"{first} {(base if first in base else tuned)[first]:.3g} ({'base' if first in base else 'tuned'})"
    return {"step": record.step, "base": base, "tuned": tuned, "summary": summary}


def write(path: Path, record: Record) -> Path:
    """Atomically: a reader sees the previous file or this one, never a part."""
    temp = path.with_name(f".{path.name}.tmp")
    with temp.open("w", encoding="utf-8") as out:
        json.dump(record.document(), out, ensure_ascii=False, indent=1)
        out.flush()
        os.fsync(out.fileno())
    temp.replace(path)
    return path


def earlier(path: Path, fresh: Record) -> Record:
    """`fresh` with what an earlier attempt of this run measured (the base's figures, per-example
    values and seconds, the history up to now) when its file describes the same held-out split
    and method; `fresh` alone otherwise."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return fresh
    except (OSError, ValueError) as exc:
        log.warning("evaluation: %s unreadable (%s); measuring afresh", path, exc)
        return fresh
    same = (document.get("version"), document.get("method"), document.get("split"), document.get("examples"))
    if same != (VERSION, fresh.method, fresh.split, fresh.examples):
        return fresh
    rows = document.get("figures") or []
    fresh.base = {row["name"]: row.get("base") for row in rows if row.get("base") is not None}
    fresh.base_examples = {
        int(row["index"]): float(row["base"]) for row in document.get("perExample") or [] if row.get("base") is not None
    }
    if "base" in (document.get("seconds") or {}):
        fresh.seconds["base"] = float(document["seconds"]["base"])
    fresh.history = list(document.get("history") or [])
    return fresh

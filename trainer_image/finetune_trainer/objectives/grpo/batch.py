"""A GRPO micro-batch from its rollouts: the scored sequences, their advantages and figures.

A prompt row's G completions become G sequences of prompt + completion, right-padded, labelled
on the completion's tokens only (up to and including its end token, TRL's completion mask); a
padding row (fsdp, past the data's end) becomes one sequence of its prompt with no label, which
adds nothing. The advantages are made from the rewards once every micro-batch of the step is
scored (`with_advantages`): the batch's spread (`scaleRewards: batch`) is the whole step's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ...data.batches import Row, collate
from ...data.tokens import IGNORE
from .loss import STD_FLOOR, advantages
from .rewards import Scores


@dataclass(frozen=True)
class PromptRow:
    """One record of `dataset.format: prompt`: its prompt's tokens and its place in the data."""

    input_ids: list[int]
    index: int  # the record's number in the training data (what its rewards read)
    weight: int = 1  # 0: a padding row, which adds nothing

    @property
    def targets(self) -> int:
        return self.weight

    @property
    def tokens(self) -> int:
        return len(self.input_ids)


@dataclass(frozen=True)
class MicroRollouts:
    """One micro-batch's rollouts: per real completion, in rows' order (G per row)."""

    rows: tuple[PromptRow, ...]
    completions: tuple[tuple[int, ...], ...]  # token ids, the end token kept where generated
    texts: tuple[str, ...] = ()
    scores: Scores | None = None  # None: only padding rows
    advantages: tuple[float, ...] = ()
    truncated: tuple[bool, ...] = ()  # no end token within maxCompletionLength
    extra: dict[str, Any] = field(default_factory=dict)  # per-micro tensors the loss reads (old log-probs)

    @property
    def real_rows(self) -> list[PromptRow]:
        return [row for row in self.rows if row.weight]


def sequences(micro: MicroRollouts, generations: int) -> list[Row]:
    """The scored sequences: G per real row (prompt + completion, the completion labelled), one
    unlabelled prompt for a padding row."""
    out: list[Row] = []
    completions = iter(micro.completions)
    for row in micro.rows:
        if not row.weight:
            out.append(Row(row.input_ids, [IGNORE] * len(row.input_ids), list(range(len(row.input_ids)))))
            continue
        for _ in range(generations):
            completion = list(next(completions))
            ids = row.input_ids + completion
            labels = [IGNORE] * len(row.input_ids) + completion
            out.append(Row(ids, labels, list(range(len(ids)))))
    return out


def advantage_column(micro: MicroRollouts, generations: int) -> list[float]:
    """Each scored sequence's advantage, 0 for a padding row's."""
    values = iter(micro.advantages)
    out: list[float] = []
    for row in micro.rows:
        out += [next(values) for _ in range(generations)] if row.weight else [0.0]
    return out


def tensors(micro: MicroRollouts, generations: int, pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The micro-batch as the model and the loss read it."""
    batch = collate(sequences(micro, generations), pad_id, device, packed=False)
    batch["advantages"] = torch.tensor(advantage_column(micro, generations), dtype=torch.float32, device=device)
    for name, value in micro.extra.items():
        batch[name] = value.to(device)
    return batch


def with_advantages(
    micros: Sequence[MicroRollouts], generations: int, scale: str, batch_std: float | None
) -> list[MicroRollouts]:
    """Each completion's advantage: its total reward less its group's mean, divided by its
    group's spread, the step's (`batch_std`, over every rank) or nothing, plus TRL's floor."""
    out = []
    for micro in micros:
        if micro.scores is None:
            out.append(micro)
            continue
        totals = torch.tensor(micro.scores.totals, dtype=torch.float64).float()
        if scale == "batch":
            assert batch_std is not None
            centred = advantages(totals, generations, "none")
            found = centred / (batch_std + STD_FLOOR)
        else:
            found = advantages(totals, generations, "group" if scale == "group" else "none")
        out.append(replace(micro, advantages=tuple(float(v) for v in found)))
    return out


def completion_figures(micro: MicroRollouts) -> list[float]:
    """The micro-batch's completion sums: their count, total length, and how many were cut."""
    lengths = [len(c) for c in micro.completions]
    return [float(len(lengths)), float(sum(lengths)), float(sum(micro.truncated))]


# The output folder's record of what the policy wrote: a reported step's first group a line.
COMPLETIONS_FILE = "completions.jsonl"


def write_group(path: Path, step: int, record: Mapping[str, Any], micro: MicroRollouts, names: Sequence[str]) -> None:
    """Append the first group of `micro` (its prompt's G completions, each reward's value, the
    weighted total and the advantage) as one JSON line."""
    assert micro.scores is not None
    size = micro.scores.num_generations
    rows = []
    for i in range(size):
        rewards = {name: micro.scores.values[k][i] for k, name in enumerate(names)}
        rows.append(
            {
                "text": micro.texts[i],
                "tokens": len(micro.completions[i]),
                "rewards": rewards,
                "reward": micro.scores.totals[i],
                "advantage": micro.advantages[i] if micro.advantages else None,
            }
        )
    line = {"step": step, "prompt": record.get("prompt"), "completions": rows}
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(line, ensure_ascii=False) + "\n")

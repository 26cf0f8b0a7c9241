"""The base's and the tuned model's figures on the held-out rows, collective over the ranks.

One held-out pass (passes.py) gives the objective's own loss; the objective keeps each row's
figures on the way (`TrainingObjective.examples`), and every rank's rows are summed into one
list, so each rank ends with the same figures:

- SFT: `loss`, the answer tokens' cross-entropy weighted by tokens (the loop's eval loss), and
  `perplexity` = exp(loss); per example, its own answer-token loss.
- DPO and ORPO: `loss`, the objective's loss on the held-out pairs; `preferenceAccuracy`, the
  share of pairs whose chosen answer has the higher summed log-probability; and for the tuned
  model `rewardAccuracy` and `rewardMargin`, the objective's implicit reward as TRL logs
  `rewards/accuracies` and `rewards/margins` (the base's reward is zero by construction: null).
  Per example, the chosen answer's summed log-probability less the rejected one's.
- Another objective: its loss alone.

The base is the same model with every LoRA layer switched off, as DPO's reference is
(`objectives.preference.adapters_off`): no second copy of the weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from ..distributed.gradsync import sum_figures
from ..objectives.preference import Preference, adapters_off
from ..objectives.sft import Sft
from .passes import HeldOutPass

# A perplexity past this is said as such, not as an overflow (exp(710) is past a float).
MAX_LOSS_FOR_PERPLEXITY = 700.0


@dataclass(frozen=True)
class Measured:
    """One model's figures (name -> value, None where it has none), per-example values by the
    held-out example's index, and the seconds the measure took."""

    figures: dict[str, float | None]
    per_example: dict[int, float] = field(default_factory=dict)
    seconds: float = 0.0


def measure(
    held_out: HeldOutPass, rows: Sequence[Any], *, base: bool, stop: Callable[[], bool] | None = None
) -> Measured | None:
    """The figures of the base (`base`: adapter off) or of the tuned model on `rows`, whose index
    is the held-out example's; None when the ranks agreed to stop part-way (`stop`)."""
    started = time.monotonic()
    objective = held_out.objective
    kept: dict[int, tuple[float, ...]] = {}
    width = len(objective.example_names)

    def each(ids: list[int]) -> None:
        found = objective.examples or []
        kept.update((index, values) for index, values in zip(ids, found, strict=False))
        objective.examples = []

    objective.examples = [] if width else None
    try:
        with adapters_off(held_out.model) if base else nullcontext():
            loss = held_out.run(rows, each if width else None, stop)
    finally:
        objective.examples = None
    if loss is None:
        return None
    examples = _gathered(kept, len(rows), width, held_out)
    figures, per_example = _figures(objective, loss, examples, base)
    return Measured(figures, per_example, round(time.monotonic() - started, 3))


def _gathered(
    kept: dict[int, tuple[float, ...]], count: int, width: int, held_out: HeldOutPass
) -> list[tuple[float, ...]]:
    """Every example's figures on every rank: each rank's own put in place, summed over the ranks."""
    if not width:
        return []
    flat = [0.0] * (count * width)
    for index, values in kept.items():
        flat[index * width : (index + 1) * width] = values
    summed = sum_figures(flat, held_out.ranks.world_size, held_out.device)
    return [tuple(summed[i * width : (i + 1) * width]) for i in range(count)]


def _figures(
    objective: object, loss: float, examples: list[tuple[float, ...]], base: bool
) -> tuple[dict[str, float | None], dict[int, float]]:
    if isinstance(objective, Sft):
        per_example = {i: total / targets for i, (total, targets) in enumerate(examples) if targets > 0}
        perplexity = math.exp(loss) if loss < MAX_LOSS_FOR_PERPLEXITY else math.inf
        return {"loss": loss, "perplexity": perplexity}, per_example
    if isinstance(objective, Preference):
        pairs = [e for e in examples if e[3] > 0]
        per_example = {i: e[0] for i, e in enumerate(examples) if e[3] > 0}
        count = max(len(pairs), 1)
        figures: dict[str, float | None] = {
            "loss": loss,
            "preferenceAccuracy": sum(1.0 for e in pairs if e[0] > 0) / count,
            "rewardAccuracy": None if base else sum(1.0 for e in pairs if e[1] > e[2]) / count,
            "rewardMargin": None if base else sum(e[1] - e[2] for e in pairs) / count,
        }
        return figures, per_example
    return {"loss": loss}, {}

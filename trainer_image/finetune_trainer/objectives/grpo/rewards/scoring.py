"""The step's rewards: each reward's values, their weighted sum per completion, and the figures.

`score` runs every reward on the batch (G consecutive completions per prompt) and checks what
each returns; a reward that raises, or returns another count or a value that is not a finite
number, fails as `RewardFailed` naming it. The total of a completion is the weighted sum of its
rewards, as TRL's GRPOTrainer sums `reward_weights` x each function's reward.

The figures are built from sums (`Scores.sums`, named by `sum_names`) so that the loop can add
them over micro-batches and ranks, and keep them in a step stopped part-way, like every
objective's figures; `figures` turns the step's sums into, under TRL's names where TRL logs the
figure:

- `reward`, `reward_std`: the mean of the totals and their standard deviation over the step
  (Bessel's, as TRL's `nanstd`);
- `rewards/<name>/mean`, `rewards/<name>/std`: the same of each reward's own (unweighted) values;
- `reward_group_std`: the spread within groups, the standard deviation of the totals within
  each group (Bessel's), averaged over the groups: 0 means the advantages are all 0, nothing is
  learned from that step;
- `frac_reward_zero_std`: the share of groups whose totals are all the same (TRL's test: a
  standard deviation within 1e-8 of 0).

A standard deviation of fewer than two values is NaN, as TRL's `nanstd` gives it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from .base import Completions, Reward, RewardError, RewardFailed

# TRL's `torch.isclose(std, 0)`: an absolute tolerance of 1e-8 (its relative one is 0 at 0).
ZERO_STD = 1e-8


def checked(name: str, values: Sequence[object], expected: int) -> tuple[float, ...]:
    """A reward's values as floats: `expected` finite numbers, else the reward's failure."""
    if len(values) != expected:
        raise RewardFailed(name, f"returned {len(values)} rewards for {expected} completions")
    found = []
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise RewardFailed(name, f"returned {value!r} for completion {index}, not a finite number")
        found.append(float(value))
    return tuple(found)


def run_reward(reward: Reward, batch: Completions) -> tuple[float, ...]:
    """One reward's values for the batch; whatever goes wrong is `RewardFailed` naming it."""
    try:
        values = reward.score(batch)
    except RewardFailed:
        raise
    except RewardError as exc:
        raise RewardFailed(reward.name, str(exc)) from None
    except Exception as exc:  # a reward's own bug or a library's error: still one line, no traceback
        raise RewardFailed(reward.name, f"{type(exc).__name__}: {exc}") from None
    return checked(reward.name, values, len(batch))


def _group_std(values: Sequence[float]) -> float:
    # TRL takes a lone completion's spread as 0 (num_generations 1 happens only in evaluation).
    return statistics.stdev(values) if len(values) > 1 else 0.0


@dataclass(frozen=True)
class Scores:
    names: tuple[str, ...]
    # values[k][i]: reward k's own value for completion i (unweighted).
    values: tuple[tuple[float, ...], ...]
    # totals[i]: completion i's weighted sum, what the advantages are computed from.
    totals: tuple[float, ...]
    num_generations: int

    def groups(self) -> list[tuple[float, ...]]:
        size = self.num_generations
        return [self.totals[start : start + size] for start in range(0, len(self.totals), size)]

    def sums(self) -> tuple[float, ...]:
        """The figures' sums for this batch, in `sum_names(names)`'s order: add them up elementwise
        over micro-batches and ranks, then `figures` gives the step's figures."""
        found: list[float] = []
        for series in (*self.values, self.totals):
            found += [math.fsum(series), math.fsum(v * v for v in series)]
        spreads = [_group_std(group) for group in self.groups()]
        zero = sum(1.0 for spread in spreads if abs(spread) <= ZERO_STD)
        return (*found, float(len(self.totals)), float(len(spreads)), math.fsum(spreads), zero)


def sum_names(names: Sequence[str]) -> tuple[str, ...]:
    """What each of `Scores.sums` holds, for rewards named `names` in their order."""
    series = [*(f"rewards/{name}" for name in names), "reward"]
    pairs = [f"{kind}/{part}" for kind in series for part in ("sum", "sum_of_squares")]
    return (*pairs, "completions", "groups", "group_std_sum", "zero_std_groups")


def _mean_std(total: float, squares: float, count: float) -> tuple[float, float]:
    mean = total / count
    if count < 2:
        return mean, math.nan
    # Rounding can leave a hair below 0 where every value is the same.
    return mean, math.sqrt(max(0.0, (squares - total * mean) / (count - 1)))


def figures(names: Sequence[str], sums: Sequence[float]) -> dict[str, float]:
    """The step's reward figures (module docstring) from the sums of all its batches."""
    if len(sums) != len(sum_names(names)):
        raise ValueError(f"{len(sums)} sums for {len(sum_names(names))} names")
    count, groups, group_std_sum, zero = sums[-4:]
    found: dict[str, float] = {}
    for index, name in enumerate(names):
        mean, std = _mean_std(sums[2 * index], sums[2 * index + 1], count)
        found[f"rewards/{name}/mean"], found[f"rewards/{name}/std"] = mean, std
    found["reward"], found["reward_std"] = _mean_std(sums[-6], sums[-5], count)
    found["reward_group_std"] = group_std_sum / groups
    found["frac_reward_zero_std"] = zero / groups
    return found


def score(rewards: Sequence[Reward], batch: Completions, num_generations: int) -> Scores:
    """Every reward's values for `batch` and each completion's weighted sum."""
    if num_generations < 1 or len(batch) % num_generations:
        raise ValueError(f"{len(batch)} completions are not groups of {num_generations}")
    values = tuple(run_reward(reward, batch) for reward in rewards)
    totals = tuple(
        math.fsum(reward.weight * column[i] for reward, column in zip(rewards, values, strict=True))
        for i in range(len(batch))
    )
    return Scores(tuple(reward.name for reward in rewards), values, totals, num_generations)

"""GRPO's step figures, under TRL's names (also their TensorBoard tags under train/).

The loop adds up an objective's sums over micro-batches and ranks (and keeps them in a step
stopped part-way); GRPO's are the rewards' (rewards.scoring: each reward's and the total's sum
and sum of squares, the completions, the groups' spreads) and the loss's (`FIXED_SUMS`: the KL
and the clip indicators over the scored tokens, the completions' lengths and how many ran to
maxCompletionLength). The figures are the step's means of them, in the order status keeps them
(it holds the first 16): the rewards first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from .loss import CLIP_HIGH, CLIP_LOW, CLIP_REGION, KL
from .rewards import figures as reward_figures
from .rewards import sum_names

FIXED_SUMS: Final = (
    "klSum",
    "clipLowSum",
    "clipHighSum",
    "clipRegionSum",
    "scoredTokens",
    "completionCount",
    "completionLengthSum",
    "truncatedCount",
)
MEAN_LENGTH: Final = "completions/mean_length"
CLIPPED: Final = "completions/clipped_ratio"


def step_figures(names: Sequence[str], sums: Sequence[float], with_kl: bool) -> dict[str, float]:
    """The step's figures from its sums (`sum_names(names)` then `FIXED_SUMS`)."""
    split = len(sum_names(names))
    rewards = reward_figures(names, sums[:split])
    kl, low, high, region, tokens, completions, lengths, truncated = sums[split:]
    tokens, completions = max(tokens, 1.0), max(completions, 1.0)
    out = {"reward": rewards["reward"]}
    out.update({f"rewards/{name}/mean": rewards[f"rewards/{name}/mean"] for name in names})
    for name in ("reward_std", "reward_group_std", "frac_reward_zero_std"):
        out[name] = rewards[name]
    out[MEAN_LENGTH] = lengths / completions
    out[CLIPPED] = truncated / completions
    if with_kl:
        out[KL] = kl / tokens
    out[CLIP_REGION] = region / tokens
    out[CLIP_LOW] = low / tokens
    out[CLIP_HIGH] = high / tokens
    out.update({f"rewards/{name}/std": rewards[f"rewards/{name}/std"] for name in names})
    return out


def text(metrics: Mapping[str, float]) -> str | None:
    """A few words for `kubectl get -o wide` and `ftjob status`: the mean reward, the spread
    within groups, the completions' mean length, and the KL where measured."""
    if "reward" not in metrics:
        return None
    words = [f"reward {metrics['reward']:.3g}"]
    if "reward_group_std" in metrics:
        words.append(f"spread {metrics['reward_group_std']:.2g}")
    if MEAN_LENGTH in metrics:
        words.append(f"len {metrics[MEAN_LENGTH]:.0f}")
    if KL in metrics:
        words.append(f"kl {metrics[KL]:.2g}")
    return " ".join(words)[:64]

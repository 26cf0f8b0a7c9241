"""GRPO's loss: group-relative advantages and TRL 1.16.0's clipped surrogate, in pure FP32.

The arithmetic is `GRPOTrainer`'s (trl/trainer/grpo_trainer.py: the advantages in
`_generate_and_score_completions`, the loss and its logged figures in `_compute_loss`) for the
loss types offered (`settings.LossType`), at TRL's defaults for what this project does not offer:
token-level importance sampling, no two-sided clip (`delta`), no entropy mask or bonus, no
off-policy mask, no vLLM sampling correction. tests/trainer/test_grpo_loss.py holds it to TRL's
own code within 1e-5.

Every function here takes and returns FP32 tensors and refuses anything else: the trainer's
precision guard keeps half precision out of the model, and these are where it would slip back in.

How the loop uses it (the next slice): the step's loss is `loss_sum` over its micro-batches and
ranks divided by the step's `loss_count` over the same (the loop's `counts()[0]`), the
project's rule for every objective, so 2 processes train what 1 with twice the accumulation does.
That is TRL's loss for `grpo`, `dr_grpo` and `dapo` at any accumulation; `bnpo`, which TRL
normalises by each micro-batch's own tokens, equals TRL's only with one micro-batch per step
(over several, the step's tokens normalise it, which is `dapo`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import torch

from .settings import GrpoSettings, ScaleRewards

# TRL's guard against a group whose rewards are all equal (std 0): its advantages become 0.
STD_FLOOR: Final = 1e-4

# The figures' names, as TRL logs them (also their TensorBoard tags under train/).
KL: Final = "kl"
CLIP_LOW: Final = "clip_ratio/low_mean"
CLIP_HIGH: Final = "clip_ratio/high_mean"
CLIP_REGION: Final = "clip_ratio/region_mean"
CLIP_LOW_MIN: Final = "clip_ratio/low_min"
CLIP_HIGH_MAX: Final = "clip_ratio/high_max"


def _fp32(name: str, tensor: torch.Tensor) -> None:
    if tensor.dtype != torch.float32:
        raise TypeError(f"GRPO loss: {name} is {tensor.dtype}, the trainer computes it in float32 only")


def per_token_logps(logits: torch.Tensor, completion_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """Each completion token's log-probability under the temperature-scaled distribution: TRL's
    selective log-softmax (`selective_log_softmax`, the fused head's `log_probs`).

    `logits` (..., V) are those at the positions that predict `completion_ids` (...), that is a
    model's logits[:, -C - 1 : -1] for C completion tokens, after the family's own transform
    (soft-cap, logit scale), which TRL applies before the temperature too. The log-softmax is
    taken as the selected logit less the log-sum-exp, so no (..., V) log-probability tensor is
    kept beside the logits.

    Under the loss head (model/loss_head.py), which never hands out full-vocabulary logits, the
    next slice calls this inside the head's chunk function, on each chunk's
    `self.head(hidden).float()` after `self.transform` and on the chunk's shifted targets, and
    scatters the chunk's values into a (B, T - 1) tensor (as `_chunk_rows` scatters sums), under
    `checkpoint` as the chunks are now, so one chunk's logits are alive at a time in the forward
    and again in the backward. The same call on the policy, the old policy (no gradient) and the
    reference (adapter off, no gradient) gives the three inputs of `grpo_loss`.
    """
    _fp32("logits", logits)
    if temperature <= 0:
        raise ValueError(f"GRPO loss: temperature {temperature}, must be above 0")
    scaled = logits / temperature if temperature != 1.0 else logits
    chosen = torch.gather(scaled, -1, completion_ids.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(scaled, dim=-1)


def advantages(rewards: torch.Tensor, num_generations: int, scale: ScaleRewards) -> torch.Tensor:
    """Each completion's advantage from the total rewards (N,), in groups of `num_generations`
    consecutive completions of one prompt: its reward less its group's mean, divided by the
    spread `scale` names plus STD_FLOOR (TRL's `sum_then_normalize`).

    `group`: the group's standard deviation; `batch`: the whole batch's (the mean still the
    group's, as TRL does); `none`: not divided (Dr. GRPO). Standard deviations are Bessel-corrected,
    as TRL's `nanstd`. The batch is what every rank gathered: a group is never split.
    """
    _fp32("rewards", rewards)
    if rewards.dim() != 1 or rewards.numel() % num_generations != 0:
        raise ValueError(
            f"GRPO advantages: {tuple(rewards.shape)} rewards are not whole groups of {num_generations} completions"
        )
    groups = rewards.view(-1, num_generations)
    centred = rewards - groups.mean(dim=1).repeat_interleave(num_generations)
    if scale == "none":
        return centred
    if scale == "group":
        spread = groups.std(dim=1).repeat_interleave(num_generations)
    else:
        spread = rewards.std().expand_as(rewards)
    return centred / (spread + STD_FLOOR)


@dataclass(frozen=True)
class TokenTerms:
    """The per-token parts of the loss, (B, C) each, before the mask and the aggregation."""

    loss: torch.Tensor  # the clipped surrogate's negative, plus beta x KL where beta is set
    ratio: torch.Tensor  # pi / pi_old (TRL's coef_1)
    kl: torch.Tensor | None  # k3 estimator of KL(pi || pi_ref), times the ratio where bias-corrected


def token_terms(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    settings: GrpoSettings,
) -> TokenTerms:
    """TRL's per-token surrogate. `old_logps` None: the policy that sampled is this one (one
    iteration per batch), so the ratio is 1 but still carries the gradient; `ref_logps` is read
    only where beta is set."""
    for name, tensor in (
        ("logps", logps),
        ("old_logps", old_logps),
        ("ref_logps", ref_logps),
        ("advantages", advantages),
    ):
        if tensor is not None:
            _fp32(name, tensor)
    old = logps.detach() if old_logps is None else old_logps
    ratio = torch.exp(logps - old)
    column = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    clipped = torch.clamp(ratio, 1 - settings.epsilon, 1 + settings.clip_high)
    loss = -torch.min(ratio * column, clipped * column)
    kl = None
    if settings.beta != 0.0:
        if ref_logps is None:
            raise ValueError("GRPO loss: beta is set but no reference log-probabilities were given")
        # k3: exp(r - p) - (r - p) - 1, unbiased and never negative (Schulman's estimator).
        kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        if settings.use_bias_correction_kl:
            kl = kl * ratio
        loss = loss + settings.beta * kl
    return TokenTerms(loss, ratio, kl)


def loss_sum(terms: TokenTerms, mask: torch.Tensor, settings: GrpoSettings) -> torch.Tensor:
    """The micro-batch's loss before the step's division by `loss_count`: the masked tokens'
    sum, or for `grpo` each completion's mean over its tokens, summed over the completions."""
    masked = terms.loss * mask
    if settings.loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum()
    return masked.sum()


def loss_count(mask: torch.Tensor, settings: GrpoSettings) -> float:
    """What the loss is a mean over, for these completions: the completions (`grpo`), each
    counted at `max_completion_length` tokens (`dr_grpo`), or their completion tokens (`dapo`,
    `bnpo`)."""
    completions = mask.shape[0]
    if settings.loss_type == "grpo":
        return float(completions)
    if settings.loss_type == "dr_grpo":
        return float(completions * settings.max_completion_length)
    return float(mask.sum())


def _clipped(terms: TokenTerms, advantages: torch.Tensor, settings: GrpoSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens the clip binds on, low and high: a ratio below 1 - epsilon with a negative
    advantage, above 1 + epsilon_high with a positive one (where the min takes the clipped side)."""
    column = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    low = (terms.ratio < 1 - settings.epsilon) & (column < 0)
    high = (terms.ratio > 1 + settings.clip_high) & (column > 0)
    return low, high


def figure_sums(terms: TokenTerms, advantages: torch.Tensor, mask: torch.Tensor, settings: GrpoSettings) -> list[float]:
    """Sums a step adds over its micro-batches and ranks: the masked KL, the masked clip
    indicators (low, high, either) and the tokens they are counted over (`figures` divides).
    For one micro-batch that is TRL's figure; over several, TRL logs the mean of each
    micro-batch's mean and these give the step's token-weighted mean, the same however the step
    is split over processes and accumulation."""
    low, high = _clipped(terms, advantages, settings)
    kl = 0.0 if terms.kl is None else float((terms.kl * mask).sum())
    parts = (low.float(), high.float(), (low | high).float())
    return [kl, *(float((part * mask).sum()) for part in parts), float(mask.sum())]


def clip_extremes(
    terms: TokenTerms, advantages: torch.Tensor, mask: torch.Tensor, settings: GrpoSettings
) -> list[float]:
    """The lowest completion's share of low-clipped tokens and the highest one's of high-clipped
    tokens (TRL's `low_min`, `high_max`): the step takes the min and the max of them over its
    micro-batches and ranks. A completion with no tokens is left out; NaN where all are."""
    counts = mask.sum(-1)
    kept = counts > 0
    if not bool(kept.any()):
        return [math.nan, math.nan]
    low, high = _clipped(terms, advantages, settings)
    low_share = ((low.float() * mask).sum(-1) / counts)[kept]
    high_share = ((high.float() * mask).sum(-1) / counts)[kept]
    return [float(low_share.min()), float(high_share.max())]


def figures(sums: list[float], extremes: list[float], settings: GrpoSettings) -> dict[str, float]:
    """The step's figures under TRL's names from `figure_sums` and `clip_extremes` (KL only where
    beta is set, as TRL logs it)."""
    kl, low, high, region, tokens = sums
    tokens = max(tokens, 1.0)
    out = {CLIP_LOW: low / tokens, CLIP_HIGH: high / tokens, CLIP_REGION: region / tokens}
    out[CLIP_LOW_MIN], out[CLIP_HIGH_MAX] = extremes
    if settings.beta != 0.0:
        out[KL] = kl / tokens
    return out


def grpo_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor | None,
    ref_per_token_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    settings: GrpoSettings,
    num_items: float | None = None,
) -> tuple[torch.Tensor, Mapping[str, float]]:
    """The loss of one batch of completions (B, C) and its figures, as TRL's `_compute_loss`
    returns and logs them for a step of this one micro-batch on one process.

    `completion_mask` is 1 on each completion's tokens, 0 on its padding; `num_items` is what
    `dapo` divides by, the active tokens of the whole step over every rank (TRL's
    `num_items_in_batch`; None: this batch's own)."""
    mask = completion_mask.to(torch.float32)
    terms = token_terms(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, settings)
    count = loss_count(mask, settings)
    if settings.loss_type == "dapo" and num_items is not None:
        count = num_items
    loss = loss_sum(terms, mask, settings) / max(count, 1.0)
    sums = figure_sums(terms, advantages, mask, settings)
    return loss, figures(sums, clip_extremes(terms, advantages, mask, settings), settings)

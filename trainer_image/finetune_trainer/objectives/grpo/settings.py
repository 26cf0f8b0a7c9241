"""GRPO's settings as the trainer reads them: the API block `training.grpo`
(finetune_api.objectives.grpo.GrpoSpec.as_settings) made a frozen dataclass.

Names and defaults mirror TRL 1.16.0's `GRPOConfig` where the two overlap, so a job written with
TRL's meaning of a setting trains the same here; the API block carries these under their
camelCase names (`numGenerations`, `maxCompletionLength`, `lossType`, ...); tests/trainer/test_grpo_api.py
holds the two to the same names and defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The loss aggregations offered (TRL's names; its other loss types are not offered yet).
LossType = Literal["grpo", "dr_grpo", "dapo", "bnpo"]
# How rewards become advantages (TRL's `scale_rewards`): divide by the std within each group,
# by the std over the whole batch, or not at all (Dr. GRPO).
ScaleRewards = Literal["group", "batch", "none"]


@dataclass(frozen=True)
class GrpoSettings:
    num_generations: int = 8  # numGenerations: completions per prompt (the group)
    # maxCompletionLength: the 256 rather than TRL's 512, as the KV cache of G
    # completions is what a GRPO step on an old card runs short of first.
    max_completion_length: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    beta: float = 0.0  # KL to the reference (the model with its adapter off); 0: no reference pass
    epsilon: float = 0.2  # clip low: the ratio's floor is 1 - epsilon
    epsilon_high: float | None = None  # clip high (DAPO's clip-higher); None: epsilon
    num_iterations: int = 1  # optimiser passes over one batch of rollouts (TRL's mu)
    loss_type: LossType = "dapo"
    scale_rewards: ScaleRewards = "group"
    # The KL term times the ratio to the sampling policy (DeepSeek-V3.2's unbiased estimator; on by
    # default in TRL 1.16): it only differs from the plain k3 term once the policy has moved.
    use_bias_correction_kl: bool = True

    def __post_init__(self) -> None:
        # TRL refuses a group of one (its std is undefined and every advantage is 0).
        if self.num_generations < 2:
            raise ValueError(f"training.grpo.numGenerations: {self.num_generations}, at least 2")
        if self.max_completion_length < 1:
            raise ValueError(f"training.grpo.maxCompletionLength: {self.max_completion_length}, at least 1")
        if self.temperature <= 0:
            raise ValueError(f"training.grpo.temperature: {self.temperature}, must be above 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"training.grpo.topP: {self.top_p}, must be in (0, 1]")
        if self.beta < 0:
            raise ValueError(f"training.grpo.beta: {self.beta}, must be 0 or more")
        if self.epsilon < 0 or (self.epsilon_high is not None and self.epsilon_high < 0):
            raise ValueError("training.grpo.epsilon: must be 0 or more")
        if self.num_iterations < 1:
            raise ValueError(f"training.grpo.numIterations: {self.num_iterations}, at least 1")

    @property
    def clip_high(self) -> float:
        """The upper clipping epsilon: epsilon_high where set, else epsilon (TRL's rule)."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

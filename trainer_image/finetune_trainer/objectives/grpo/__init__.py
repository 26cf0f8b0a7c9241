"""GRPO (`training.method: grpo`): group-relative policy optimisation with verifiable rewards.

objective.py is the objective the loop runs (the step's rollouts, rewards and advantages, its
micro-batches and loss); rollouts.py the rollout engine's seam and the policy's own engine;
sampling.py the tokens drawn from counter-based noise; batch.py the scored micro-batch;
figures.py the step's figures; loss.py TRL's loss; rewards/ the rewards; settings.py the settings
(from the API's `training.grpo`, finetune_api.objectives.grpo).
"""

from .settings import GrpoSettings, LossType, ScaleRewards

__all__ = ["GrpoSettings", "LossType", "ScaleRewards"]

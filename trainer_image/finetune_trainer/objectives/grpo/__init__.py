"""GRPO (issue #55, in progress): group-relative policy optimisation with verifiable rewards.

This package holds the parts the objective will call: its settings (settings.py), the loss and
the group-relative advantages (loss.py) and the rewards. The objective in the loop (rollouts by
the policy, the API block, the planner's step) comes next; nothing here is reachable from a job yet.
"""

from .settings import GrpoSettings, LossType, ScaleRewards

__all__ = ["GrpoSettings", "LossType", "ScaleRewards"]

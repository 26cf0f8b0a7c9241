"""The trainer's side of the launch decision: the planner's `choose()` on the hardware it sees.

The pod's command (the launcher) and every process it starts call this with the same inputs,
so they agree on the mode and the process count; `ftjob plan` calls the same `choose()`.
"""

from __future__ import annotations

import logging
from typing import Any

from finetune_api.reasons import ExitReason
from finetune_api.trainer_config import TrainerConfig
from finetune_plan.inputs import as_mapping
from finetune_plan.model_shape import ModelConfigError
from finetune_plan.parallelism import LaunchPlan, choose

from .failures import TrainerFailure
from .hardware import Attention, Hardware

log = logging.getLogger(__name__)


def decide(config: TrainerConfig, hardware: Hardware, model_config: Any, attention: Attention = "eager") -> LaunchPlan:
    """The launch for this pod; raises WontFit (before any weight loads) when the plan says no."""
    gpus = hardware.gpus
    try:
        launch = choose(
            config.spec,
            as_mapping(model_config) if gpus else None,
            len(gpus),
            gpu_memory_bytes=min(g.total_bytes for g in gpus) if gpus else None,
            gpu_name=gpus[0].name if gpus else None,
            # SDPA runs the memory-efficient kernel; eager materialises the attention matrix.
            attention="memory_efficient" if attention == "sdpa" else "materialised",
            model_name=config.paths.model,
        )
    except ModelConfigError as exc:
        raise TrainerFailure(ExitReason.InvalidConfig, str(exc)) from None
    if not launch.fits:
        assert launch.plan is not None
        raise TrainerFailure(ExitReason.WontFit, launch.plan.message)
    if launch.plan is not None:
        log.info("plan: %s", launch.plan.summary)
    return launch


def check_world(launch: LaunchPlan, world_size: int) -> None:
    """The launcher started as many processes as the plan asks for (a local `--nproc` may differ on the CPU).

    `world_size` is the pod's (the local world): a job of several nodes runs the plan in each pod."""
    if launch.plan is not None and world_size != launch.processes:
        raise TrainerFailure(
            ExitReason.InvalidConfig,
            f"{launch.parallelism} on this pod needs {launch.processes} process(es), {world_size} were started",
        )
    if launch.parallelism == "deviceMap" and world_size != 1:
        raise TrainerFailure(
            ExitReason.InvalidConfig, "spec.training.parallelism deviceMap runs one process; --nproc must be 1"
        )


def loss_chunk_tokens(launch: LaunchPlan) -> int:
    return launch.plan.recipe.loss_chunk_tokens if launch.plan is not None else 0

"""Pre-flight before any weight is loaded: will it fit, and how much may each GPU hold.

The memory arithmetic lives in `finetune_trainer.planning` (the planner). This module is the
one call site the trainer uses; without a plan it falls back to a conservative split that
leaves activation headroom on the first GPU (embeddings) and the last (LM head and logits).
"""

import logging
from dataclasses import dataclass
from typing import Any

from finetune_api.trainer_config import TrainerConfig

from .hardware import Hardware

log = logging.getLogger(__name__)

GIB = 1024**3
# Without a plan: what CUDA context, allocator slack and the step's activations may need.
FALLBACK_RESERVE_EDGE = 0.25
FALLBACK_RESERVE_MIDDLE = 0.15


@dataclass(frozen=True)
class MemoryPlan:
    max_memory: dict[int | str, int] | None  # bytes per GPU index for device_map="auto"; None on CPU
    source: str  # "planner", "fallback" or "cpu"
    summary: dict[str, Any]
    device_map: dict[str, int] | None = None  # the planner's layer placement, when it made one


def _fallback(hardware: Hardware) -> MemoryPlan:
    gpus = hardware.gpus
    budget: dict[int | str, int] = {}
    for position, gpu in enumerate(gpus):
        edge = position in (0, len(gpus) - 1)
        reserve = FALLBACK_RESERVE_EDGE if edge else FALLBACK_RESERVE_MIDDLE
        budget[gpu.index] = int(gpu.total_bytes * (1 - reserve))
    return MemoryPlan(budget, "fallback", {f"cuda:{k}": round(v / GIB, 2) for k, v in budget.items()})


def plan_memory(config: TrainerConfig, hardware: Hardware, model_config: Any, attention: str = "eager") -> MemoryPlan:
    """Raise TrainerFailure(WontFit) when the plan says no; else the per-GPU budget."""
    if not hardware.on_gpu:
        return MemoryPlan(None, "cpu", {})
    try:
        from . import planning
    except ImportError:
        planning = None  # type: ignore[assignment]
    preflight = getattr(planning, "trainer_preflight", None) if planning is not None else None
    if preflight is None:
        plan = _fallback(hardware)
        log.info("memory plan (fallback, no planner): %s GiB per GPU", plan.summary)
        return plan
    # SDPA runs the memory-efficient kernel; eager materialises the attention matrix.
    kind = "memory_efficient" if attention == "sdpa" else "materialised"
    result = preflight(config, hardware, model_config, attention=kind)
    log.info("memory plan: %s", result.summary)
    budget: dict[int | str, int] = {int(k): int(v) for k, v in (result.max_memory or {}).items()}
    return MemoryPlan(budget or None, "planner", dict(result.summary), result.device_map)

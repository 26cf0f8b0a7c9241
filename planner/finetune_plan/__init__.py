"""The planner: will a job fit its GPUs, in which mode, and how fast will it train.

A layer of its own beside `finetune_api`, pure Python on purpose (no torch): the operator (the
pod's grace period), `ftjob plan` on a laptop, the trainer before it loads any weight, and the
benchmarks all import it, and it imports nothing of theirs (only `finetune_api`).
"""

from finetune_api.modes import RunMode as Parallelism

from .gpu_products import GpuProduct, lookup
from .memory import GIB, GpuMemory, Recipe
from .model_shape import ModelConfigError, ModelShape, known_model, shape_from_config
from .parallelism import TRAINER_LOSS_CHUNKS, LaunchPlan, choose, cpu_launch
from .plan import Hardware, Layout, Plan, make_plan
from .recompute import ActivationAsk, LayerLayout
from .speed import Speed

__all__ = [
    "GIB",
    "TRAINER_LOSS_CHUNKS",
    "ActivationAsk",
    "GpuMemory",
    "GpuProduct",
    "Hardware",
    "LaunchPlan",
    "LayerLayout",
    "Layout",
    "ModelConfigError",
    "ModelShape",
    "Parallelism",
    "Plan",
    "Recipe",
    "Speed",
    "choose",
    "cpu_launch",
    "known_model",
    "lookup",
    "make_plan",
    "shape_from_config",
]

"""Pre-flight planning: will a job fit its GPUs, in which mode, and how fast will it train.

Pure Python on purpose (no torch): `ftjob plan` runs it on a laptop, and the trainer runs it
before loading any weights so a job that cannot fit fails in seconds with the numbers.
"""

from .gpu_products import GpuProduct, lookup
from .memory import GIB, GpuMemory, Recipe
from .model_shape import ModelConfigError, ModelShape, known_model, shape_from_config
from .parallelism import TRAINER_LOSS_CHUNKS, LaunchPlan, Parallelism, choose, cpu_launch
from .plan import Hardware, Layout, Plan, make_plan
from .preflight import preflight, trainer_preflight
from .speed import Speed

__all__ = [
    "GIB",
    "TRAINER_LOSS_CHUNKS",
    "GpuMemory",
    "GpuProduct",
    "Hardware",
    "LaunchPlan",
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
    "preflight",
    "shape_from_config",
    "trainer_preflight",
]

"""The planner: will a job fit its GPUs, in which mode, and how fast will it train.

A layer of its own beside `finetune_api`, pure Python on purpose (no torch): the operator (the
pod's grace period), `ftjob plan` on a laptop, the trainer before it loads any weight, and the
benchmarks all import it, and it imports nothing of theirs (only `finetune_api`).

By concern: `results` (what a plan hands back), `layouts` (each mode's memory on every GPU),
`search` (the mode, the loss chunks, the savers, the pair split: `make_plan`), `recompute` (the
layers' activations), `host` (every host-memory figure and limit), `pairs` (a row's sequences
through the model), `grpo` (GRPO's step: its rollouts and forwards without gradients beside the
scored pass), `messages` (what a person reads of a plan); beneath them `memory` (the GPU's
bytes per component), `speed`, `placement`, `model_shape`, `families`, `gpu_products` and
`calibration`; above them `parallelism.choose` (a spec to a launch), `pod` (what the operator
plans), `grace`, `tighter` and `lengths`.
"""

from finetune_api.modes import RunMode as Parallelism

from .gpu_products import GpuProduct, lookup
from .memory import GIB, GpuMemory, Recipe
from .model_shape import ModelConfigError, ModelShape, known_model, shape_from_config
from .parallelism import TRAINER_LOSS_CHUNKS, LaunchPlan, choose, cpu_launch
from .recompute.ask import ActivationAsk
from .results.activations import LayerLayout
from .results.layout import Hardware, Layout
from .results.plan import Plan
from .search.make import make_plan
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

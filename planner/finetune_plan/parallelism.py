"""How a pod's processes share the work: the one decision `ftjob plan` and the trainer both call.

`choose()` turns a spec and the hardware the pod really has into a LaunchPlan: the mode in the
spec's words (`training.parallelism`), the number of processes to launch, and on GPUs the memory
and speed plan. Both callers go through it, so the mode `ftjob plan` prints is by construction
the mode the trainer runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, cast

from finetune_api import modes
from finetune_api.modes import RunMode as Parallelism
from finetune_api.spec import FineTuneJobSpec

from .families import DEFAULT_FAMILY, resolve_targets
from .gpu_products import GpuProduct
from .host.limit import pod_host_limit
from .inputs import product_for, recipe_from_spec
from .memory import GIB, Attention
from .model_shape import ModelConfigError, shape_from_config
from .results.layout import Hardware
from .results.plan import Plan
from .search.chunks import LOSS_CHUNK_TOKENS
from .search.make import make_plan
from .search.modes import ModeChoice
from .speed import Mode

# Loss chunk sizes the trainer can run, tried in order; 0 = whole-sequence logits. Chunks are
# needed: Llama-3.3-70B on 4 x P40 at 2048 tokens does not fit in fsdp with whole-sequence
# FP32 logits (three copies of 2048 x 128256 floats, 2.9 GiB, next to the gathered head), and
# neither does the 40-layer 70B-shaped slice on 2 x 22.4 GiB.
TRAINER_LOSS_CHUNKS: Final[tuple[int, ...]] = (0, LOSS_CHUNK_TOKENS)

# deviceMap keeps one GPU busy at a time: `auto` never picks it, a spec may still ask for it.
AUTO_MODES: Final[tuple[Mode, ...]] = cast(tuple[Mode, ...], modes.auto_choices())


@dataclass(frozen=True)
class LaunchPlan:
    parallelism: Parallelism
    processes: int  # processes in the pod (world size on one node)
    plan: Plan | None  # the memory/speed plan; None on the CPU

    @property
    def fits(self) -> bool:
        """False only when a GPU plan says the job does not fit (the CPU is not planned)."""
        return self.plan is None or self.plan.fits


def cpu_launch(spec: FineTuneJobSpec) -> LaunchPlan:
    """The CPU's launch needs no model config: the pod runs what the spec says."""
    wanted = spec.training.parallelism
    parallelism: Parallelism = "dataParallel" if wanted == modes.AUTO else wanted
    processes = modes.processes(parallelism, spec.resources.processes or 1)
    return LaunchPlan(parallelism, processes, None)


def choose(
    spec: FineTuneJobSpec,
    model_config: Mapping[str, Any] | None,
    gpus: int,
    gpu_memory_bytes: int | None = None,
    gpu_name: str | None = None,
    *,
    attention: Attention = "materialised",
    epoch_tokens: int | None = None,
    model_name: str = "",
    product: GpuProduct | None = None,
    loss_chunks: Sequence[int] = TRAINER_LOSS_CHUNKS,
    host_memory: int | None = None,
    host_memory_per_gpu: int | None = None,
) -> LaunchPlan:
    """The launch for `spec` on `gpus` visible GPUs of `gpu_memory_bytes` each (the smallest,
    when they differ; default: the product's), named `gpu_name` by torch (default: the spec's
    `resources.gpuProduct`); `product` replaces the looked-up product (what-if figures);
    `loss_chunks` the loss chunk sizes to try (a retry after an OOM names the one it runs).
    The pod's host memory bounds the plan (`host.limit.pod_host_limit`): the spec's
    `resources.memory`, else `host_memory` (the pod's own limit, read in the pod), else
    `host_memory_per_gpu` bytes per GPU (the chart's figure for the product; default: the product's).

    On the CPU: the spec's parallelism (auto: dataParallel) with `resources.processes`
    processes (deviceMap: one). On GPUs: the planner's mode (auto: the fastest of dataParallel
    and fsdp that fits, never deviceMap, which only a spec that names it gets; on
    one GPU dataParallel, the world-size-1 case), one process per GPU (deviceMap: one). A plan
    that does not fit is returned with `plan.fits` False, not raised; a `model_config` the
    planner cannot read raises ModelConfigError.
    """
    if gpus < 1:
        return cpu_launch(spec)
    if model_config is None:
        raise ModelConfigError("config.json: the model's config is needed to plan GPUs")
    chosen = product or product_for(gpu_name, spec.resources.gpu_product)
    memory_gib = gpu_memory_bytes / GIB if gpu_memory_bytes else chosen.memory_gib
    shape = shape_from_config(model_config, name=model_name)
    family = shape.family or DEFAULT_FAMILY
    targets = resolve_targets(family, spec.lora.target_modules)
    if family.kernel == "eager":  # the family has no SDPA path: the trainer runs eager attention
        attention = "materialised"
    plan = make_plan(
        shape,
        replace(recipe_from_spec(spec, chosen, attention), lora_targets=targets),
        Hardware(gpus, chosen, memory_gib),
        mode=cast(ModeChoice, modes.to_planner(spec.training.parallelism)),
        epoch_tokens=epoch_tokens,
        allowed_modes=AUTO_MODES,
        loss_chunks=loss_chunks,
        checkpointing=spec.training.gradient_checkpointing,
        offload=spec.training.activation_offload,
        kept_layers=spec.training.kept_layers,
        pair_split=spec.training.pair_split,
        host_limit=pod_host_limit(spec, gpus, chosen, host_memory, host_memory_per_gpu),
    )
    parallelism = cast(Parallelism, modes.to_spec(plan.mode))
    return LaunchPlan(parallelism, modes.processes(parallelism, gpus), plan)

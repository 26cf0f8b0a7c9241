"""The plan: does this job fit these GPUs, in which mode, with what per-GPU peak, how fast.

`make_plan` (`search.make`) builds it; the trainer, the operator, `ftjob plan` and the bench read
it. Its summary (the trainer's log and status) and `to_dict` (`ftjob plan --json`) are records
of its own fields, rounded for people; the sentences are `messages`'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from finetune_api.modes import to_spec

from .. import pairs
from ..grpo.step import GrpoStep, step_of
from ..host.limit import HostLimit
from ..host.need import HostNeed
from ..memory import GIB, GpuMemory, Recipe
from ..model_shape import ModelShape
from ..speed import Mode, Speed
from .activations import Activations, LayerLayout
from .layout import Hardware, Layout


@dataclass(frozen=True)
class Plan:
    """One job on one pod's GPUs: the verdict, the layout and the recipe as planned, and the
    figures beside them (speed, the pod's host memory, what the other modes would need)."""

    fits: bool
    mode: Mode
    hardware: Hardware
    shape: ModelShape
    recipe: Recipe
    layout: Layout
    speed: Speed | None
    message: str
    # The pod's host memory (`host`), with why it does not fit a node where it does not.
    host: HostNeed
    alternatives: tuple[Layout, ...] = ()
    suggestions: tuple[str, ...] = ()
    device_map: dict[str, int] | None = None
    max_memory: dict[int, int] | None = None
    activations: Activations | None = None
    # The most host memory the pod may have (None: unbounded, the planner's own tests).
    host_limit: HostLimit | None = None
    # With the pair split: the closest the unsplit micro-batch came (what it would need).
    unsplit: Layout | None = None

    @property
    def pinned_host_gib_per_process(self) -> float:
        """Pinned host memory of the offloaded activations, per process."""
        return self.host.pinned / GIB

    @property
    def host_refusal(self) -> str | None:
        """Why the pod does not fit a node's host memory (a GPU plan that fits, but too much pinned)."""
        return self.host.refusal

    @property
    def parallelism(self) -> str:
        """The mode in the spec's words: dataParallel, fsdp or deviceMap."""
        return to_spec(self.mode)

    @property
    def per_gpu(self) -> tuple[GpuMemory, ...]:
        return self.layout.per_gpu

    @property
    def host_gib_per_process(self) -> float:
        """What one process holds on the host at its peak (the load), in GiB."""
        return self.host.per_process / GIB

    @property
    def whole_load_host_gib_per_process(self) -> float | None:
        """fsdp over several GPUs on a checkpoint it cannot stream: the whole packed model per
        process (the trainer refuses that load when the pod's memory is below it)."""
        return None if self.host.whole_load is None else self.host.whole_load / GIB

    @property
    def shortfall_gib(self) -> float:
        return self.layout.shortfall / GIB

    @property
    def summary(self) -> dict[str, Any]:
        """A compact record for the trainer's log and status."""
        return {
            "fits": self.fits,
            "parallelism": self.parallelism,
            "loss_chunk_tokens": self.layout.loss_chunk_tokens,
            "per_gpu_total_gib": {f"cuda:{g.index}": round(g.total / GIB, 2) for g in self.per_gpu},
            "min_headroom_gib": round(self.layout.fullest.headroom / GIB, 2),
            "host_gib_per_process": _rounded(self.host_gib_per_process),
            "whole_load_host_gib_per_process": _rounded(self.whole_load_host_gib_per_process),
            "tokens_per_second": None if self.speed is None else round(self.speed.tokens_per_second, 1),
            **self.activation_summary,
            **self.pair_summary,
            "message": self.message,
        }

    @property
    def grpo(self) -> GrpoStep | None:
        """GRPO's step as planned (its rollouts' KV cache, its seconds by part); None for another
        method."""
        return step_of(self.shape, self.recipe, self.speed, self.mode)

    @property
    def pair_summary(self) -> dict[str, Any]:
        """How a row's sequences go through the model and what the forwards without gradients
        cost (an objective of one sequence a row without them: nothing)."""
        recipe, speed = self.recipe, self.speed
        out: dict[str, Any] = {}
        if recipe.sequences_per_row > 1 and recipe.grpo is None:
            out["pair_split"] = recipe.pair_split
            out["sequences_per_pass"] = recipe.batch_size
        if recipe.reference_forwards:
            out["reference_forwards"] = recipe.reference_forwards
            out["reference_seconds"] = None if speed is None else round(speed.reference_seconds, 3)
        if recipe.pair_split:
            out["split_forward_seconds"] = None if speed is None else round(speed.split_seconds, 3)
        step = self.grpo
        if step is not None:
            out["grpo"] = step.to_dict()
        return out

    @property
    def layers(self) -> LayerLayout:
        """Which layers keep, recompute or offload their activations: what the trainer applies."""
        return LayerLayout.of(self.shape, self.recipe)

    @property
    def activation_summary(self) -> dict[str, Any]:
        """The layers' layout in the summary's words (the trainer's log and status)."""
        act, layers = self.activations, self.layers
        return {
            "gradient_checkpointing": self.recipe.gradient_checkpointing,
            "kept_layers": layers.kept,
            "recomputed_layers": layers.recomputed,
            "offloaded_layers": layers.offloaded,
            "inputs_offloaded": layers.inputs_offloaded,
            "pinned_host_gib_per_process": round(self.pinned_host_gib_per_process, 2),
            "checkpointing": None if act is None else act.checkpointing,
            "offload": None if act is None else act.offload,
            "all_recompute_tokens_per_second": None
            if act is None or act.all_recompute_tokens_per_second is None
            else round(act.all_recompute_tokens_per_second, 1),
        }

    def to_dict(self) -> dict[str, Any]:
        speed: dict[str, Any] | None = None
        if self.speed is not None:
            speed = {
                "flops_per_token": self.speed.flops_per_token,
                "tokens_per_second": round(self.speed.tokens_per_second, 2),
                "step_seconds": round(self.speed.step_seconds, 3),
                "bound": self.speed.bound,
                "epoch_tokens": self.speed.epoch_tokens,
                "seconds_per_epoch": None
                if self.speed.seconds_per_epoch is None
                else round(self.speed.seconds_per_epoch, 1),
                "reference_seconds": round(self.speed.reference_seconds, 3),
                "split_forward_seconds": round(self.speed.split_seconds, 3),
                "rollout_seconds": round(self.speed.rollout_seconds, 3),
                "old_logp_seconds": round(self.speed.old_logp_seconds, 3),
            }
        return {
            "fits": self.fits,
            "parallelism": self.parallelism,
            "message": self.message,
            "gpus": self.hardware.gpus,
            "gpu_product": self.hardware.product.name,
            "gpu_memory_gib": self.hardware.memory_gib,
            "model": {
                "name": self.shape.name,
                "parameters": self.shape.total_params,
                "layers": self.shape.layers,
                "hidden": self.shape.hidden,
            },
            "max_length": self.recipe.max_length,
            "batch_size": self.recipe.rows,
            **self.activation_summary,
            **self.pair_summary,
            "pairs": pairs.describe(self.recipe),
            "grpo": None if self.grpo is None else self.grpo.to_dict(),
            "loss_chunk_tokens": self.layout.loss_chunk_tokens,
            "shortfall_gib": round(self.shortfall_gib, 2),
            "host_gib_per_process": _rounded(self.host_gib_per_process),
            "host_limit": None
            if self.host_limit is None
            else {
                "gib": round(self.host_limit.limit / GIB, 2),
                "source": self.host_limit.describe(),
                "detail": self.host_limit.detail or None,
            },
            "per_gpu": [gpu_dict(g) for g in self.per_gpu],
            "alternatives": [
                {
                    "parallelism": to_spec(a.mode),
                    "fits": a.fits,
                    "max_total_gib": round(a.fullest.total / GIB, 2),
                    "loss_chunk_tokens": a.loss_chunk_tokens,
                }
                for a in self.alternatives
            ],
            "suggestions": list(self.suggestions),
            "device_map": self.device_map,
            "max_memory": None if self.max_memory is None else {str(k): v for k, v in self.max_memory.items()},
            "speed": speed,
        }


def gpu_dict(g: GpuMemory) -> dict[str, Any]:
    def gib(value: float) -> float:
        return round(value / GIB, 3)

    return {
        "index": g.index,
        "layers": g.layers,
        "quantised_weights_gib": gib(g.quantised_weights),
        "embeddings_head_gib": gib(g.embeddings_head),
        "norms_gib": gib(g.norms),
        "lora_optimizer_gib": gib(g.lora_optimizer),
        "workspaces_gib": gib(g.workspaces),
        "activations_gib": gib(g.activations),
        "temporaries_gib": gib(g.temporaries),
        "logits_gib": gib(g.logits),
        "rollouts_gib": gib(g.rollouts),
        "overhead_gib": gib(g.overhead),
        "allocated_gib": gib(g.allocated),
        "total_gib": gib(g.total),
        "capacity_gib": gib(g.capacity),
        "headroom_gib": gib(g.headroom),
        "peak_phase": g.peak_phase,
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)

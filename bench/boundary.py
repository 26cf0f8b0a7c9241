"""The planner at its edge: shapes whose plan leaves at most 1 GiB of headroom under a P40's cap,
run through the pod's command, plan against measured peak, OOM or not.

For each (width, sequence length, gradient checkpointing) below, the deepest slice the trainer's
own plan (`finetune_plan.choose`, the call the trainer makes, with the GPU capped at 22.4 GiB)
says fits on one GPU is found by search; then `python -m finetune_trainer` (bench.trainer_job)
trains it for `steps` steps with a checkpoint and an evaluation inside, every process capped at
the same 22.4 GiB. One model per width is written once, as deep as the deepest slice; each
slice's folder links its weights and names fewer layers in its config (the loader leaves the
rest unread). The record holds, per shape: the plan's peak and headroom, the measured peak, the
loss-chunk choice, the exit reason; the planner's error is measured - planned over planned.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

CAP_GIB: Final = 22.4
GIB: Final = 2**30
# Llama-3 proportions, vocabulary 128256: the 8B and the 70B layer shapes.
WIDTHS: Final[dict[str, dict[str, int]]] = {
    "8b": {"hidden": 4096, "inter": 14336, "heads": 32, "kv": 8, "vocab": 128256},
    "70b": {"hidden": 8192, "inter": 28672, "heads": 64, "kv": 8, "vocab": 128256},
}


@dataclass(frozen=True)
class Point:
    width: str
    seq: int
    ckpt: bool | str  # gradientCheckpointing: true, false or "auto"
    batch: int = 1
    layers: int | None = None  # a set depth (auto); None: the deepest the plan says fits

    @property
    def name(self) -> str:
        return shape_name(self.width, self.seq, self.batch, self.ckpt)


def shape_name(width: str, seq: int, batch: int, ckpt: bool | str) -> str:
    """A point's name: width, tokens, batch and gradientCheckpointing, e.g. 8b-s2048-b1-nockpt."""
    word = "auto" if ckpt == "auto" else "ckpt" if ckpt else "nockpt"
    return f"{width}-s{seq}-b{batch}-{word}"


# Points whose deepest fitting slice is at most 16 layers of either shape (two models of about
# 8 GB and 30 GB of fp16 on the bench machine's disk), headroom under 1 GiB, across both widths,
# 512 to 4096 tokens, batch 1 to 4 and both checkpointing settings.
POINTS: Final = (
    Point("8b", 512, False, batch=4),
    Point("8b", 1024, False, batch=2),
    Point("8b", 2048, False),
    Point("8b", 4096, False),
    Point("70b", 512, False),
    Point("70b", 1024, True, batch=4),
    Point("70b", 2048, True),
)
# `gradientCheckpointing: auto` (and `activationOffload: auto`, both the defaults) at depths where
# all-recompute leaves room: the plan keeps layers up to its margin and offloads the rest, so
# these plans stand at the cap less the margin by construction.
AUTO_POINTS: Final = (
    Point("8b", 4096, "auto", layers=16),
    Point("70b", 1024, "auto", batch=2, layers=8),
)
# Long sequences on the trainer's fused fp32 attention (issue 38; the `long` phase): the 70B-shaped
# slice at 2048, 4096 and 8192 tokens, 8 layers (the deepest the plan fits at 8192 under the cap
# with every layer's input on the GPU is 9: one model serves the three), Llama-3.1-8B's whole shape
# (32 layers) at 8192, and the 70B slice at 8192 with 12 layers, which fits only with the
# recomputing layers' inputs in host memory (the plan turns that on).
LONG_POINTS: Final = (
    Point("70b", 2048, True, layers=8),
    Point("70b", 4096, True, layers=8),
    Point("70b", 8192, True, layers=8),
    Point("8b", 8192, True, layers=32),
    Point("70b", 8192, True, layers=12),
)


def model_config(width: str, layers: int) -> dict[str, Any]:
    """The config.json the reference builder writes for this width and depth (Llama)."""
    arch = WIDTHS[width]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": arch["hidden"],
        "intermediate_size": arch["inter"],
        "num_hidden_layers": layers,
        "num_attention_heads": arch["heads"],
        "num_key_value_heads": arch["kv"],
        "vocab_size": arch["vocab"],
        "tie_word_embeddings": False,
    }


def trainer_spec(point: Point, steps: int) -> dict[str, Any]:
    """The FineTuneJob spec `bench.trainer_job` writes for this point (kept in step with it)."""
    from bench.trainer_job import spec_for

    return spec_for(
        seq=point.seq, steps=steps, ckpt=point.ckpt, gpus=1, parallelism="auto", every=steps // 2, batch=point.batch
    )


def planned_attention(ran: str | None) -> str:
    """The planner's word for the kernel a recorded run ran (its summary's `attention`): the
    fused `sdpa_expanded` keeps no probabilities; a row without the field predates it and ran
    transformers' SDPA, which in fp32 with grouped-query heads is the math kernel, or eager."""
    return "memory_efficient" if ran == "sdpa_expanded" else "materialised"


def capped_launch(spec: dict[str, Any], config: dict[str, Any], attention: str = "memory_efficient") -> Any:
    """The trainer's own launch decision for `spec` on `config`, one GPU capped at CAP_GIB
    (`attention`: the planner's word for the kernel; the trainer's fused one by default)."""
    from finetune_api.spec import FineTuneJobSpec
    from finetune_plan import choose

    return choose(
        FineTuneJobSpec.model_validate(spec),
        config,
        1,
        gpu_memory_bytes=int(CAP_GIB * GIB),
        gpu_name="NVIDIA H200",
        attention=attention,
    )


def planned(point: Point, layers: int, steps: int, attention: str = "memory_efficient") -> Any:
    """The trainer's own plan for `layers` layers of `point` on one GPU capped at CAP_GIB."""
    return capped_launch(trainer_spec(point, steps), model_config(point.width, layers), attention).plan


def deepest(point: Point, steps: int, most: int = 120) -> int:
    """The most layers the plan says fit (0 when not even one does); a point's set depth when it
    fits."""
    if point.layers is not None:
        return point.layers if planned(point, point.layers, steps).fits else 0
    low, high = 0, most
    while low < high:
        middle = (low + high + 1) // 2
        if planned(point, middle, steps).fits:
            low = middle
        else:
            high = middle - 1
    return low


def slice_folder(model: Path, folder: Path, layers: int) -> Path:
    """A model folder of `layers` layers over `model`'s weights: links, and a config of its own."""
    folder.mkdir(parents=True, exist_ok=True)
    for item in model.iterdir():
        link = folder / item.name
        if item.name != "config.json" and not link.exists():
            link.symlink_to(item.resolve())
    config = json.loads((model / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
    return folder


def judge(point: Point, layers: int, plan: Any, ours: dict[str, Any] | None) -> dict[str, Any]:
    """One row of the record: plan against the measured peak."""
    plan_gib = round(plan.layout.fullest.total / GIB, 2)
    row: dict[str, Any] = {
        "point": point.name,
        "width": point.width,
        "seq": point.seq,
        "batch": point.batch,
        "gradientCheckpointing": point.ckpt,
        "layers": layers,
        "planGiB": plan_gib,
        "planAllocatedGiB": round(plan.layout.fullest.allocated / GIB, 2),
        "planHeadroomGiB": round(plan.layout.fullest.headroom / GIB, 2),
        "planLossChunkTokens": plan.layout.loss_chunk_tokens,
    }
    if ours is None:
        return {**row, "ran": False}
    peaks = ours.get("peak_gib") or []
    measured = max(peaks) if peaks else None
    row.update(
        ran=True,
        exitCode=ours.get("exit_code"),
        reason=ours.get("reason"),
        oom=ours.get("reason") == "OutOfMemory" or "out of memory" in str(ours.get("message", "")).lower(),
        finalStep=ours.get("finalStep"),
        measuredPeakGiB=measured,
        errorPct=round(100 * (measured - plan_gib) / plan_gib, 1) if measured else None,
        trainerPlanGiB=ours.get("plan"),
        attention=ours.get("attention"),
        activationLayout=ours.get("activations"),
        peakHostGiBPerProcess=ours.get("peakHostGiBPerProcess"),
        halfTensors=ours.get("half_tensors"),
        tokPerS=ours.get("tok_s"),
    )
    return row


RESULTS: Final = Path(__file__).resolve().parent / "results"
HEADER: Final = (
    "| point | layers | plan GiB (headroom) | plan allocated GiB | loss | measured peak GiB "
    "| measured / plan allocated | outcome |\n"
    "| --- | ---: | ---: | ---: | --- | ---: | ---: | --- |"
)


def plan_allocated_gib(total_gib: float) -> float:
    """The plan's allocated part of a total: what max_memory_allocated compares with (the total
    adds the CUDA context and the allocator slack, `GpuMemory.overhead`)."""
    from finetune_plan import calibration as cal

    return (total_gib - cal.CUDA_CONTEXT_GIB) / (1 + cal.ALLOCATOR_SLACK)


def table(record: dict[str, Any]) -> str:
    """A boundary record as the Markdown table the READMEs show: the plan's total (what "fits" is
    decided on) and its allocated part, against PyTorch's allocated peak."""
    lines = [HEADER]
    for row in record.get("points", []):
        plan = row.get("trainerPlanGiB") or {}
        planned_gib = max(plan.values()) if plan else row["planGiB"]
        allocated = row.get("planAllocatedGiB") or plan_allocated_gib(planned_gib)
        measured = row.get("measuredPeakGiB")
        loss = f"chunks of {row['planLossChunkTokens']}" if row.get("planLossChunkTokens") else "whole sequence"
        if not row.get("ran", True):
            outcome = "not run"
        elif row.get("reason") == "OutOfMemory":
            outcome = "OOM"
        else:
            outcome = row.get("reason") or f"{row.get('finalStep')} steps"
        lines.append(
            f"| {row['point']} | {row['layers']} | {planned_gib:.2f} ({row['planHeadroomGiB']:.2f}) | {allocated:.2f} "
            f"| {loss} | {'-' if measured is None else f'{measured:.2f}'} "
            f"| {'-' if measured is None else f'{measured / allocated:.3f}'} | {outcome} |"
        )
    return "\n".join(lines)


def records(folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every committed boundary record by file name."""
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*-boundary*.json"))}


if __name__ == "__main__":
    for name, record in records().items():
        print(f"{name}\n\n{table(record)}\n")

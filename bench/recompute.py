"""`gradientCheckpointing: auto` on the GPU: each shape through the pod's command twice, every layer
recomputed and `auto`, in one call, so the ratio compares runs of the same machine and minute.

Shapes (the issue's acceptance):
- `8b`: Llama-3.1-8B's shape, all 32 layers (random-init bf16 checkpoint written on the GPU, as
  the families phase writes its slices), 2048 tokens, the GPU capped at a P40's 22.4 GiB: `auto`
  keeps what the plan leaves under the cap less the margin;
- `70b-4l`: the 4-layer 70B-shaped slice, 2048 tokens, uncapped: `auto` keeps every layer.

`auto` is the default of both settings: on the capped shape the planner keeps what fits and
offloads the rest (`activationOffload: auto` turns on where the copies cost less than the
recompute). With `--recompute-keep-only`, the capped shape runs a third time: `auto` with
offload off, the layers it cannot keep recomputed (what `auto` chose before offload had a
prefetch).

Each run trains `steps` steps (2 of warm-up, as `bench.trainer_job` counts) with the bench's
recipe (LoRA r=8 on q/k/v/o, no dropout, fp32, paged 8-bit AdamW). The record holds per shape
and run: tokens/s, the trainer's plan (total and, from the same planner here, the allocated part
that torch.cuda.max_memory_allocated compares with), the measured peak, the layers kept and
recomputed, host memory (peak RSS and anonymous), and auto's speed-up over all-recompute.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bench import boundary, families

GIB: Final = boundary.GIB
CAP_GIB: Final = boundary.CAP_GIB
SEQ: Final = 2048
# (label, gradientCheckpointing, activationOffload); the keep-only run only with --recompute-keep-only.
RUNS: Final = (("allRecompute", True, False), ("auto", "auto", "auto"))
KEEP_ONLY_RUN: Final = ("autoKeepOnly", "auto", False)


@dataclass(frozen=True)
class Shape:
    name: str
    width: str  # boundary.WIDTHS key
    layers: int
    cap_gib: float | None  # None: the whole GPU


SHAPES: Final = (Shape("8b", "8b", 32, CAP_GIB), Shape("70b-4l", "70b", 4, None))


def model_config(shape: Shape) -> dict[str, Any]:
    return boundary.model_config(shape.width, shape.layers)


def build_argv(python: str, folder: Path, shape: Shape) -> list[str]:
    """A child that writes the random-init bf16 checkpoint on the GPU (families.BUILD)."""
    config = {k: v for k, v in model_config(shape).items() if k != "architectures"}
    # Llama-3's positions and rope base, as the reference builder writes its slices (2048 tokens
    # fit LlamaConfig's default of 2048 positions too; no sample runs at the edge of it).
    config.update(max_position_embeddings=8192, rope_theta=500000.0)
    return [python, "-c", families.BUILD, str(folder), json.dumps(config)]


def runs(shape: Shape, keep_only: bool) -> list[tuple[str, bool | str, bool | str]]:
    """The runs of `shape`: all-recompute, auto, and with `keep_only` (the capped shape only,
    where not every layer is kept) auto with offload off."""
    return [*RUNS, *([KEEP_ONLY_RUN] if keep_only and shape.cap_gib is not None else [])]


def trainer_spec(ckpt: bool | str, steps: int, offload: bool | str = "auto") -> dict[str, Any]:
    """The FineTuneJob spec `bench.trainer_job` writes for a run (kept in step with it)."""
    from bench.trainer_job import spec_for

    return spec_for(seq=SEQ, steps=steps, ckpt=ckpt, gpus=1, parallelism="auto", offload=offload)


def ours_extra(shape: Shape, ckpt: bool | str, steps: int, offload: bool | str = "auto") -> dict[str, Any]:
    """bench.trainer_job's settings for one run (besides path, work and gpus)."""
    extra: dict[str, Any] = {"seq": SEQ, "ckpt": ckpt, "steps": steps, "offload": offload}
    if shape.cap_gib is not None:
        extra["gpu_memory_gib"] = shape.cap_gib
    return extra


def planned(
    shape: Shape,
    ckpt: bool | str,
    steps: int,
    gpu_gib: float | None = None,
    offload: bool | str = "auto",
    *,
    attention: str = "memory_efficient",
) -> Any:
    """The trainer's own launch decision for the run, on one H200 (capped as the run is)."""
    from finetune_api.spec import FineTuneJobSpec
    from finetune_plan import choose

    memory = shape.cap_gib or gpu_gib
    return choose(
        FineTuneJobSpec.model_validate(trainer_spec(ckpt, steps, offload)),
        model_config(shape),
        1,
        gpu_memory_bytes=int(memory * GIB) if memory else None,
        gpu_name="NVIDIA H200",
        attention=attention,
    )


def run_row(label: str, launch: Any, ours: dict[str, Any] | None) -> dict[str, Any]:
    """One run: what the plan said, what the pod's command measured."""
    plan = launch.plan
    summary = plan.summary
    row: dict[str, Any] = {
        "run": label,
        "planGiB": round(plan.layout.fullest.total / GIB, 2),
        "planAllocatedGiB": round(plan.layout.fullest.allocated / GIB, 2),
        "planTokPerS": summary["tokens_per_second"],
        "keptLayers": summary["kept_layers"],
        "recomputedLayers": summary["recomputed_layers"],
        "offloadedLayers": summary["offloaded_layers"],
        "checkpointing": summary["checkpointing"],
        "offload": summary["offload"],
        "plannedHostGiBPerProcess": summary["host_gib_per_process"],
        "plannedPinnedHostGiBPerProcess": summary["pinned_host_gib_per_process"],
    }
    if ours is None:
        return {**row, "ran": False}
    peaks = ours.get("peak_gib") or []
    measured = max(peaks) if peaks else None
    trainer = ours.get("activations") or {}
    row.update(
        ran=True,
        exitCode=ours.get("exit_code"),
        reason=ours.get("reason"),
        message=ours.get("message"),
        attention=ours.get("attention"),
        tokPerS=ours.get("tok_s"),
        stepS=ours.get("step_s"),
        timedSteps=ours.get("timed_steps"),
        measuredPeakGiB=measured,
        trainerPlanGiB=ours.get("plan"),
        # The measured peak is PyTorch's allocated bytes: compared with the plan's allocated part.
        measuredOverPlanAllocated=round(measured / row["planAllocatedGiB"], 3) if measured else None,
        measuredOverPlan=round(measured / row["planGiB"], 3) if measured else None,
        trainerKeptLayers=trainer.get("kept_layers"),
        trainerRecomputedLayers=trainer.get("recomputed_layers"),
        trainerOffloadedLayers=trainer.get("offloaded_layers"),
        peakHostGiBPerProcess=ours.get("peakHostGiBPerProcess"),
        peakHostAnonGiBPerProcess=ours.get("peakHostAnonGiBPerProcess"),
        loadSeconds=ours.get("loadSeconds"),
        lossFirst=ours.get("loss_first"),
        lossLast=ours.get("loss_last"),
    )
    return row


def judge(shape: Shape, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One shape: its runs and auto's speed-up over all-recompute (measured and planned)."""
    by = {r["run"]: r for r in rows}
    base, auto = by.get("allRecompute", {}), by.get("auto", {})
    ratio = None
    if base.get("tokPerS") and auto.get("tokPerS"):
        ratio = round(auto["tokPerS"] / base["tokPerS"], 3)
    keep_only = by.get(KEEP_ONLY_RUN[0], {})
    keep_only_ratio = None
    if base.get("tokPerS") and keep_only.get("tokPerS"):
        keep_only_ratio = round(keep_only["tokPerS"] / base["tokPerS"], 3)
    planned_ratio = None
    if base.get("planTokPerS") and auto.get("planTokPerS"):
        planned_ratio = round(auto["planTokPerS"] / base["planTokPerS"], 3)
    return {
        "shape": shape.name,
        "width": shape.width,
        "layers": shape.layers,
        "seq": SEQ,
        "capGiB": shape.cap_gib,
        "runs": rows,
        "ratio": ratio,
        "plannedRatio": planned_ratio,
        **({"keepOnlyRatio": keep_only_ratio} if keep_only else {}),
    }


HEADER: Final = (
    "| shape | run | layers kept / recomputed / offloaded | tok/s | ratio | plan GiB (allocated) | measured peak GiB "
    "| measured / plan allocated | host peak GiB (planned pinned) |\n"
    "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def table(record: dict[str, Any]) -> str:
    lines = [HEADER]
    for shape in record.get("shapes", []):
        for row in shape["runs"]:
            ratio = {"auto": shape.get("ratio"), KEEP_ONLY_RUN[0]: shape.get("keepOnlyRatio")}.get(row["run"])
            measured = row.get("measuredPeakGiB")
            lines.append(
                f"| {shape['shape']}{'' if shape['capGiB'] is None else ' @ ' + str(shape['capGiB'])} | {row['run']} "
                f"| {row['keptLayers']} / {row['recomputedLayers']} / {row.get('offloadedLayers', 0)} "
                f"| {row.get('tokPerS') or '-'} | {ratio or '-'} "
                f"| {row['planGiB']:.2f} ({row['planAllocatedGiB']:.2f}) "
                f"| {'-' if measured is None else f'{measured:.2f}'} | {row.get('measuredOverPlanAllocated') or '-'} "
                f"| {row.get('peakHostGiBPerProcess') or '-'} ({row.get('plannedPinnedHostGiBPerProcess', 0.0)}) |"
            )
    return "\n".join(lines)


RESULTS: Final = Path(__file__).resolve().parent / "results"


if __name__ == "__main__":
    for path in sorted(RESULTS.glob("*-recompute*.json")):
        print(f"{path.name}\n\n{table(json.loads(path.read_text()))}\n")

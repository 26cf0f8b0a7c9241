"""The plan part by part against the trainer's own phase probe, through the pod's command.

Each point is a short run (3 steps, a checkpoint and an evaluation at the end) of a shallow slice,
uncapped unless it says so. The trainer's summary carries `memoryParts`: its plan's parts for the
GPU (resident, activations, the backward's and the loss's transients above them) beside the same
parts measured by `finetune_trainer.memory.phases`. Shallow slices are enough, because each part
is measured on its own: the activations part is every layer's saved tensors at once, the
transients are a layer's and the loss's. The record is what `bench.calibration.memory_fit` fits
the activation, backward and loss constants to; the boundary phase then judges whole runs.

Points span both widths, 512 to 4096 tokens, batch 1 to 4, checkpointing on and off, LoRA
dropout on and off, and `auto` with offload at a depth where the cap makes it offload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from bench import boundary

STEPS: Final = 3


@dataclass(frozen=True)
class Point:
    width: str
    seq: int
    batch: int
    ckpt: bool | str
    layers: int
    cap_gib: float | None = None
    dropout: float = 0.0

    @property
    def name(self) -> str:
        extra = f"-drop{self.dropout:g}" if self.dropout else ""
        capped = f"-cap{self.cap_gib:g}" if self.cap_gib else ""
        return f"{boundary.shape_name(self.width, self.seq, self.batch, self.ckpt)}-{self.layers}l{extra}{capped}"


POINTS: Final = (
    Point("8b", 512, 4, False, 2),
    Point("8b", 2048, 1, False, 2),
    Point("8b", 2048, 1, False, 4),
    Point("8b", 4096, 1, False, 2),
    Point("8b", 2048, 1, False, 2, dropout=0.05),
    Point("8b", 4096, 2, True, 4),
    Point("70b", 512, 1, False, 2),
    Point("70b", 2048, 1, False, 2),
    Point("70b", 1024, 4, True, 4),
    Point("70b", 2048, 1, True, 4),
    Point("8b", 2048, 1, "auto", 20, cap_gib=boundary.CAP_GIB),
)


def depth(width: str) -> int:
    """The deepest slice of `width` the points run: the model written once for them."""
    return max((p.layers for p in POINTS if p.width == width), default=0)


def ours_extra(point: Point) -> dict[str, Any]:
    """bench.trainer_job's settings for the point (besides path, work and gpus)."""
    extra: dict[str, Any] = {
        "seq": point.seq,
        "batch": point.batch,
        "ckpt": point.ckpt,
        "steps": STEPS,
        "every": STEPS,
        "eval_fraction": 0.1,
        "dropout": point.dropout,
    }
    if point.cap_gib is not None:
        extra["gpu_memory_gib"] = point.cap_gib
    return extra


def row(point: Point, ours: dict[str, Any] | None) -> dict[str, Any]:
    """One point: the trainer's plan parts, the measured parts, and measured over planned per part."""
    out: dict[str, Any] = {
        "point": point.name,
        "width": point.width,
        "seq": point.seq,
        "batch": point.batch,
        "gradientCheckpointing": point.ckpt,
        "layers": point.layers,
        "dropout": point.dropout,
        "capGiB": point.cap_gib,
    }
    if ours is None:
        return {**out, "ran": False}
    parts = ours.get("memoryParts") or {}
    planned, measured = parts.get("planned") or {}, parts.get("measured") or {}
    peaks = ours.get("peak_gib") or []
    out.update(
        ran=True,
        exitCode=ours.get("exit_code"),
        reason=ours.get("reason"),
        finalStep=ours.get("finalStep"),
        activationLayout=ours.get("activations"),
        attention=ours.get("attention"),
        planned=planned,
        measured=measured,
        measuredPeakGiB=max(peaks) if peaks else None,
        ratio={k: round(measured[k] / planned[k], 3) for k in measured if planned.get(k)},
    )
    return out


def point_of(row: dict[str, Any]) -> Point:
    """The point a record's row ran."""
    cap = row.get("capGiB")
    return Point(
        str(row["width"]),
        int(row["seq"]),
        int(row["batch"]),
        row["gradientCheckpointing"],
        int(row["layers"]),
        cap_gib=float(cap) if cap else None,
        dropout=float(row.get("dropout") or 0.0),
    )


def trainer_spec(point: Point) -> dict[str, Any]:
    """The FineTuneJob spec `bench.trainer_job` writes for the point, from the same settings."""
    from bench.trainer_job import spec_for

    settings = {k: v for k, v in ours_extra(point).items() if k != "gpu_memory_gib"}
    return spec_for(gpus=1, parallelism="auto", **settings)


def planned(point: Point, attention: str = "memory_efficient") -> Any:
    """The trainer's own launch decision for the point on one H200 (capped as the run is)."""
    from finetune_api.spec import FineTuneJobSpec
    from finetune_plan import choose

    return choose(
        FineTuneJobSpec.model_validate(trainer_spec(point)),
        boundary.model_config(point.width, point.layers),
        1,
        gpu_memory_bytes=int(point.cap_gib * boundary.GIB) if point.cap_gib else None,
        gpu_name="NVIDIA H200",
        attention=attention,
    )


PART_NAMES: Final = ("resident", "activations", "backward", "loss")
HEADER: Final = (
    "| point | resident GiB | activations GiB | backward GiB | loss GiB |\n| --- | ---: | ---: | ---: | ---: |"
)


def table(rows: list[dict[str, Any]]) -> str:
    """Rows of `bench.calibration.memory_fit.parts_rows` (today's plan against the probe) as the
    README's table: planned / measured per part."""
    lines = [HEADER]
    for row in rows:
        cells = " | ".join(f"{row['planned'][k]:.2f} / {row['measured'][k]:.2f}" for k in PART_NAMES)
        lines.append(f"| {row['point']} | {cells} |")
    return "\n".join(lines)

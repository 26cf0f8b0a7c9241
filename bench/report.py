"""Turn raw bench runs into the committed result records (pure functions, no GPU needed)."""

from __future__ import annotations

import importlib.metadata
import platform
import re
import subprocess
from typing import Any

from bench.flops import Shape, flops_per_token, mfu

PACKAGES = ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "trl")


def gpu_slug(peaks: list[dict[str, Any]]) -> str:
    """'NVIDIA H200' -> 'h200', for file names."""
    name = str(peaks[0].get("gpu", "gpu")) if peaks else "gpu"
    name = re.sub(r"^(nvidia|tesla)\s+", "", name.strip(), flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def environment_versions() -> dict[str, Any]:
    versions: dict[str, Any] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    try:
        import torch

        versions["cuda"] = torch.version.cuda
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        versions["driver"] = out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
    except (ImportError, OSError, subprocess.SubprocessError):
        versions["driver"] = None
    return versions


def _relative(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(abs(a - b) / abs(b), 4)


def compare_record(
    *,
    date: str,
    shape: Shape,
    seq: int,
    steps: int,
    warm: int,
    seed: int,
    gpus: int,
    peaks: list[dict[str, Any]],
    reference: dict[str, Any] | None,
    ours: dict[str, Any] | None,
    versions: dict[str, Any],
) -> dict[str, Any]:
    values = [float(p["fp32_matmul_tflops"]) for p in peaks if "fp32_matmul_tflops" in p]
    peak = min(values) if values else None
    record: dict[str, Any] = {
        "date": date,
        "gpu": peaks[0].get("gpu") if peaks else None,
        "gpus": gpus,
        "shape": shape.__dict__,
        "seq": seq,
        "steps": steps,
        "warm_steps": warm,
        "seed": seed,
        "tf32": False,
        "gradient_checkpointing": True,
        "fp32_peak_tflops": values,
        "flops_per_token": flops_per_token(shape, seq, True),
        "reference": reference,
        "ours": ours,
        "versions": versions,
    }
    ref_ok = reference is not None and "tok_s" in reference
    ours_ok = ours is not None and "tok_s" in ours
    if ref_ok and ours_ok:
        record["ratio"] = round(ours["tok_s"] / reference["tok_s"], 3)  # type: ignore[index]
    if peak is not None:
        for key, run in (("reference", reference), ("ours", ours)):
            if run is not None and "tok_s" in run:
                # Each run over the GPUs it used (the N-GPU rows compare with a 1-GPU reference).
                used = run.get("gpus") or run.get("worldSize") or gpus
                record[f"{key}_mfu_per_gpu"] = round(mfu(run["tok_s"] / used, shape, seq, True, peak), 3)
    if ref_ok and ours_ok:
        record["loss"] = {
            "reference_last": reference["loss_last"],  # type: ignore[index]
            "ours_last": ours["loss_last"],  # type: ignore[index]
            "relative_difference": _relative(ours["loss_last"], reference["loss_last"]),  # type: ignore[index]
            "reference_first": reference["loss_first"],  # type: ignore[index]
            "ours_first": ours["loss_first"],  # type: ignore[index]
        }
        record["peak_gib_per_gpu"] = {"reference": reference["peak_gib"], "ours": ours["peak_gib"]}  # type: ignore[index]
        record["half_precision_tensors"] = {
            "reference_params": reference.get("half_params"),  # type: ignore[union-attr]
            "ours_guard": ours.get("half_tensors"),  # type: ignore[union-attr]
        }
    return record

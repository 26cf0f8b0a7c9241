"""The `dpo` phase: our DPO through the pod's command against TRL's DPOTrainer, one GPU, one call.

Both train the 70B-shaped slice with the seed recipe's settings (NF4 with double quantisation,
fp32 compute, LoRA r=8/alpha=16 on q/k/v/o without dropout, PagedAdamW8bit at 1e-4, gradient
checkpointing on every layer, TF32 off), one pair per optimizer step, each of its two sequences
`seq` tokens (a sixteenth prompt, the rest answer), beta 0.1, sigmoid loss, the reference being the model
with its adapter off. TRL's side is `bench/trl_dpo.py`; ours is `bench.trainer_job` with
`"method": "dpo"` (the Job's command). The same data file and tokenizer serve both.

The record (`<date>-<gpu>-dpo.json`): pairs per second of each and their ratio (issue 42 asks
for at least 1.0x); our measured peak (PyTorch's allocated bytes) against the allocated part of
the trainer's own plan (0.90-1.00 asked); the same for ORPO through the pod's command, which
has no TRL run beside it here (no pairs-per-second ratio is claimed for it).
"""

from __future__ import annotations

from typing import Any

from bench.boundary import plan_allocated_gib


def ours_row(ours: dict[str, Any] | None) -> dict[str, Any]:
    """What the record keeps of one run of ours: speed, and the peak against the trainer's plan."""
    if ours is None:
        return {"ran": False}
    peaks = ours.get("peak_gib") or []
    plan = ours.get("plan") or {}  # the trainer's plan: GiB per GPU, by device
    measured = max(peaks) if peaks else None
    planned = max(plan.values() if isinstance(plan, dict) else plan) if plan else None
    allocated = round(plan_allocated_gib(planned), 2) if planned else None
    return {
        "ran": True,
        "exitCode": ours.get("exit_code"),
        "reason": ours.get("reason"),
        "message": ours.get("message"),
        "pairsPerS": ours.get("pairs_s"),
        "tokPerS": ours.get("tok_s"),
        "stepS": ours.get("step_s"),
        "timedSteps": ours.get("timed_steps"),
        "lossFirst": ours.get("loss_first"),
        "lossLast": ours.get("loss_last"),
        "measuredPeakGiB": measured,
        "planGiB": planned,
        "planAllocatedGiB": allocated,
        "measuredOverPlanAllocated": round(measured / allocated, 3) if measured and allocated else None,
        "halfTensors": ours.get("half_tensors"),
        "attention": ours.get("attention"),
        "activations": ours.get("activations"),
        "loadSeconds": ours.get("loadSeconds"),
        "summary": {k: ours.get(k) for k in ("finalStep", "parallelism", "worldSize", "precision")},
    }


def record(
    *,
    date: str,
    gpu: str | None,
    seq: int,
    steps: int,
    warm: int,
    versions: dict[str, Any],
    trl: dict[str, Any] | None,
    dpo: dict[str, Any] | None,
    orpo: dict[str, Any] | None,
) -> dict[str, Any]:
    ours = ours_row(dpo)
    reference = trl or {"ran": False}
    theirs = reference.get("pairs_s")
    mine = ours.get("pairsPerS")
    return {
        "date": date,
        "gpu": gpu,
        "phase": "dpo",
        "seq": seq,
        "steps": steps,
        "warm": warm,
        "pairsPerStep": 1,
        "versions": versions,
        "trl": reference,
        "ours": ours,
        "ratio": round(mine / theirs, 3) if mine and theirs else None,
        "ourOrpo": ours_row(orpo),
    }

"""Model families on the GPU: a Gemma-2-shaped and a Qwen2.5-shaped slice through the pod's command.

Each family's layer shape (Gemma-2-9B's and Qwen2.5-7B's, their vocabularies, Gemma 2's soft-caps
and 256-wide heads, Qwen2's q/k/v biases) is written once as a random-init bf16 checkpoint of
`LAYERS` decoder layers (the trainer's own plan, `finetune_plan.choose`, fits both whole models on a
22.4 GiB P40: 15.4 and 12.3 GiB; a slice keeps the device call short). `python -m finetune_trainer`
(bench.trainer_job) then trains it for `steps` steps with a checkpoint and an evaluation inside,
capped at the same 22.4 GiB. The record holds per family: the attention kernel the trainer ran, the
plan's peak against the measured one, the half-precision tensor count (0 expected), the LoRA modules
and layer count, the exit reason and the losses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from bench import boundary

CAP_GIB: Final = boundary.CAP_GIB  # a P40's usable memory, as the boundary phase caps it
GIB: Final = boundary.GIB

LAYERS: Final = 8
SEQ: Final = 2048

# config.json of each family at one layer; num_hidden_layers is set per slice.
SHAPES: Final[dict[str, dict[str, Any]]] = {
    "gemma2-9b": {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "vocab_size": 256000,
        "sliding_window": 4096,
        "final_logit_softcapping": 30.0,
        "attn_logit_softcapping": 50.0,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    },
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
}


def model_config(family: str, layers: int) -> dict[str, Any]:
    return {**SHAPES[family], "num_hidden_layers": layers}


def trainer_spec(steps: int) -> dict[str, Any]:
    """The FineTuneJob spec `bench.trainer_job` writes for these runs (kept in step with it)."""
    from bench.trainer_job import spec_for

    return spec_for(seq=SEQ, steps=steps, ckpt=True, gpus=1, parallelism="auto", every=steps // 2, eval_fraction=0.1)


def planned(family: str, layers: int, steps: int, attention: str = "memory_efficient") -> Any:
    """The trainer's own launch decision for `layers` layers of `family` on one GPU capped at CAP_GIB."""
    return boundary.capped_launch(trainer_spec(steps), model_config(family, layers), attention)


BUILD: Final = """
import json, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
folder, config = sys.argv[1], json.loads(sys.argv[2])
torch.manual_seed(0)
cfg = AutoConfig.for_model(config.pop("model_type"), **config)
with torch.device("cuda"):
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
model.save_pretrained(folder)
print(json.dumps({"built": folder, "parameters": sum(p.numel() for p in model.parameters())}))
"""


def build_argv(python: str, folder: Path, family: str, layers: int) -> list[str]:
    """A child that writes the random-init bf16 checkpoint (on the GPU: seconds, not minutes)."""
    config = {k: v for k, v in model_config(family, layers).items() if k != "architectures"}
    return [python, "-c", BUILD, str(folder), json.dumps(config)]


def judge(family: str, layers: int, launch: Any, ours: dict[str, Any] | None) -> dict[str, Any]:
    """One row: the plan against the measured peak, precision and what LoRA adapted."""
    plan = launch.plan
    row: dict[str, Any] = {
        "family": family,
        "layers": layers,
        "seq": SEQ,
        "planGiB": round(plan.layout.fullest.total / GIB, 2),
        # What torch.cuda.max_memory_allocated should read: the plan less CUDA context and slack.
        "planAllocatedGiB": round(plan.layout.fullest.allocated / GIB, 2),
        "planHeadroomGiB": round(plan.layout.fullest.headroom / GIB, 2),
    }
    if ours is None:
        return {**row, "ran": False}
    peaks = ours.get("peak_gib") or []
    measured = max(peaks) if peaks else None
    trainer_plan = ours.get("plan") or {}
    planned_gib = max(trainer_plan.values()) if trainer_plan else row["planGiB"]
    row.update(
        ran=True,
        exitCode=ours.get("exit_code"),
        reason=ours.get("reason"),
        finalStep=ours.get("finalStep"),
        attention=ours.get("attention"),
        trainerPlanGiB=trainer_plan,
        measuredPeakGiB=measured,
        measuredOverPlan=round(measured / planned_gib, 3) if measured else None,
        measuredOverPlanAllocated=round(measured / row["planAllocatedGiB"], 3) if measured else None,
        halfTensors=ours.get("half_tensors"),
        lora=ours.get("lora"),
        lossFirst=ours.get("loss_first"),
        lossLast=ours.get("loss_last"),
        tokPerS=ours.get("tok_s"),
    )
    return row


HEADER: Final = (
    "| family (layer shape) | layers | attention | plan GiB (allocated) | measured peak GiB "
    "| measured / plan (/ allocated) | half tensors | LoRA | outcome |\n"
    "| --- | ---: | --- | ---: | ---: | ---: | ---: | --- | --- |"
)


def table(record: dict[str, Any]) -> str:
    lines = [HEADER]
    for row in record.get("families", []):
        if not row.get("ran"):
            lines.append(f"| {row['family']} | {row['layers']} | - | {row['planGiB']:.2f} | - | - | - | - | not run |")
            continue
        plan = row.get("trainerPlanGiB") or {}
        planned_gib = max(plan.values()) if plan else row["planGiB"]
        lora = row.get("lora") or {}
        adapted = f"{', '.join(lora.get('modules') or [])} x {lora.get('layers')}" if lora else "-"
        measured = row.get("measuredPeakGiB")
        outcome = row.get("reason") or f"{row.get('finalStep')} steps"
        lines.append(
            f"| {row['family']} | {row['layers']} | {row.get('attention')} | {planned_gib:.2f} "
            f"({row['planAllocatedGiB']:.2f}) | {'-' if measured is None else f'{measured:.2f}'} "
            f"| {row.get('measuredOverPlan') or '-'} ({row.get('measuredOverPlanAllocated') or '-'}) "
            f"| {row.get('halfTensors')} | {adapted} | {outcome} |"
        )
    return "\n".join(lines)


RESULTS: Final = Path(__file__).resolve().parent / "results"


def records(folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*-families.json"))}


if __name__ == "__main__":
    for name, record in records().items():
        print(f"{name}\n\n{table(record)}\n")

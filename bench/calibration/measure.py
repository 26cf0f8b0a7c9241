"""Measure the recipe's peak memory and speed on the visible GPUs, for the planner's calibration.

For a grid (two layer widths x two sequence lengths x gradient checkpointing on/off x 1 and 2
GPUs) it writes a small random-init Llama-shaped model to disk, loads it the way the trainer
does (NF4 + double quantisation, FP32 compute, norms and lm_head in FP32, LoRA r=8 on q/k/v/o
with dropout, PagedAdamW8bit, non-reentrant checkpointing, TF32 off) and runs a few real
training steps, recording per-GPU peak allocated memory and tokens/s. Two-GPU runs place the
layers evenly (named as the planner's device_map names them); the planner is then checked
GPU by GPU on the recorded split. Every grid point runs in its own process: in one process a
2-GPU run kept the previous run's lm_head alive on GPU 1. The JSON is rewritten after every
run, so a run cut short still leaves its results.

    PYTHONPATH=api:planner:trainer_image python bench/calibration/measure.py --out bench/calibration/measurements.json

Then `python -m bench.calibration.fit` prints the planner constants that fit the measurements.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "api"), str(ROOT / "planner"), str(ROOT / "trainer_image")]
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

# Llama-3 proportions (MLP 3.5x hidden, 4 query heads per KV head, head_dim 128) at two widths.
ARCHES: dict[str, dict[str, Any]] = {
    # `--smoke`: a toy shape that runs the whole script on the CPU in seconds, no numbers kept.
    "toy": {"hidden": 64, "intermediate": 224, "layers": 2, "heads": 4, "kv_heads": 2, "vocab": 512},
    "w2048": {"hidden": 2048, "intermediate": 7168, "layers": 8, "heads": 16, "kv_heads": 4, "vocab": 128256},
    "w4096": {"hidden": 4096, "intermediate": 14336, "layers": 8, "heads": 32, "kv_heads": 8, "vocab": 128256},
}
SEQ_LENGTHS = (512, 2048)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
GIB = 2**30
POINT_TIMEOUT_SECONDS = 300


def fp32_matmul_tflops(n: int = 8192, reps: int = 10) -> float:
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / reps
    del a, b
    torch.cuda.empty_cache()
    return round(2 * n**3 / seconds / 1e12, 2)


def write_model(path: Path, arch: dict[str, Any]) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    if (path / "config.json").exists():
        return
    config = LlamaConfig(
        vocab_size=arch["vocab"],
        hidden_size=arch["hidden"],
        intermediate_size=arch["intermediate"],
        num_hidden_layers=arch["layers"],
        num_attention_heads=arch["heads"],
        num_key_value_heads=arch["kv_heads"],
        max_position_embeddings=4096,
        rope_theta=500000.0,
        tie_word_embeddings=False,
    )
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config).to(torch.float16)
    model.save_pretrained(path, safe_serialization=True)
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def planned_device_map(arch: dict[str, Any], gpus: int) -> tuple[Any, list[int]]:
    """Layers split evenly, embeddings on the first GPU and the head on the last, named the way
    the planner's `Placement.device_map()` names them (an even split puts layers and the edge
    modules on every GPU, which tests the per-GPU model harder than the planner's own choice)."""
    from finetune_plan.placement import Placement

    if gpus == 1:
        return {"": 0 if torch.cuda.is_available() else "cpu"}, [arch["layers"]]
    layers = arch["layers"]
    counts = [layers * (g + 1) // gpus - layers * g // gpus for g in range(gpus)]
    return Placement(tuple(counts)).device_map(), counts


def train_steps(
    path: Path, arch: dict[str, Any], *, seq: int, checkpointing: bool, gpus: int, steps: int, warmup: int
) -> dict[str, Any]:
    import bitsandbytes as bnb
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    device_map, layers_per_gpu = planned_device_map(arch, gpus)
    quant = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.float32,
    )
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        path, quantization_config=quant, device_map=device_map, dtype=torch.float32, attn_implementation="sdpa"
    )
    load_seconds = time.perf_counter() - started
    for name, module in model.named_modules():
        if "norm" in name.lower() or "lm_head" in name.lower():
            module.to(torch.float32)
    model = prepare_model_for_kbit_training(
        model, use_gradient_checkpointing=checkpointing, gradient_checkpointing_kwargs={"use_reentrant": False}
    )
    model = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    )
    for param in model.parameters():
        if param.requires_grad and param.dtype != torch.float32:
            param.data = param.data.float()
    model.train()
    half = sorted({str(p.dtype) for p in model.parameters() if p.dtype in (torch.float16, torch.bfloat16)})
    optimizer = bnb.optim.PagedAdamW8bit([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    first = model.get_input_embeddings().weight.device
    devices = list(range(gpus)) if torch.cuda.is_available() else []
    for index in devices:
        torch.cuda.reset_peak_memory_stats(index)
    times: list[float] = []
    losses: list[float] = []
    for step in range(warmup + steps):
        ids = torch.randint(0, arch["vocab"], (1, seq), device=first)
        for index in devices:
            torch.cuda.synchronize(index)
        tick = time.perf_counter()
        # Only the loss is kept: the trainer drops the model output's logits before backward.
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        for index in devices:
            torch.cuda.synchronize(index)
        if step >= warmup:
            times.append(time.perf_counter() - tick)
        losses.append(round(loss.item(), 4))
    peaks = [round(torch.cuda.max_memory_allocated(i) / GIB, 3) for i in devices]
    reserved = [round(torch.cuda.max_memory_reserved(i) / GIB, 3) for i in devices]
    context = []
    for index in devices:
        free, total = torch.cuda.mem_get_info(index)
        context.append(round((total - free - torch.cuda.memory_reserved(index)) / GIB, 3))
    del model, optimizer, loss
    gc.collect()
    for index in devices:
        with torch.cuda.device(index):
            torch.cuda.empty_cache()
    if not times:
        raise RuntimeError("no timed steps")
    return {
        "layers_per_gpu": layers_per_gpu,
        "peak_allocated_gib": peaks,
        "peak_reserved_gib": reserved,
        "context_gib": context,
        "tokens_per_second": round(seq * len(times) / sum(times), 1),
        "step_seconds": round(sum(times) / len(times), 4),
        "load_seconds": round(load_seconds, 1),
        "half_precision_params": half,
        "losses": losses,
    }


def measure_point(
    path: Path, arch: dict[str, Any], *, seq: int, checkpointing: bool, gpus: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One grid point in a fresh process, so nothing of an earlier run stays allocated."""
    import subprocess

    point = {
        "path": str(path),
        "arch": arch,
        "seq": seq,
        "checkpointing": checkpointing,
        "gpus": gpus,
        "steps": args.steps,
        "warmup": args.warmup,
    }
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--point", json.dumps(point)],
            capture_output=True,
            text=True,
            timeout=POINT_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {POINT_TIMEOUT_SECONDS}s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:400]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run_point(text: str) -> int:
    point = json.loads(text)
    try:
        result = train_steps(
            Path(point["path"]),
            point["arch"],
            seq=point["seq"],
            checkpointing=point["checkpointing"],
            gpus=point["gpus"],
            steps=point["steps"],
            warmup=point["warmup"],
        )
    except Exception as exc:  # reported as the point's error; the grid goes on
        result = {"error": repr(exc)[:400]}
    print(json.dumps(result), flush=True)
    return 0


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--point":
        return run_point(sys.argv[2])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("measurements.json"))
    parser.add_argument("--models", type=Path, default=Path("/tmp/finetune-calibration-models"))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--arches", default="w2048,w4096", help="comma-separated subset of " + ", ".join(ARCHES))
    parser.add_argument("--smoke", action="store_true", help="run the toy shape on the CPU to check the script")
    args = parser.parse_args()
    if args.smoke:
        args.arches, args.steps, args.warmup = "toy", 1, 1
    elif not torch.cuda.is_available():
        print("no CUDA GPU visible: the calibration needs one (two for the 2-GPU runs)", file=sys.stderr)
        return 1
    import bitsandbytes
    import peft
    import transformers

    on_gpu = torch.cuda.is_available()
    visible = torch.cuda.device_count() if on_gpu else 1
    record: dict[str, Any] = {
        "recorded": datetime.now(UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0) if on_gpu else "cpu",
        "gpu_count": visible if on_gpu else 0,
        "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / GIB, 2) if on_gpu else None,
        "fp32_matmul_tflops": fp32_matmul_tflops() if on_gpu else None,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "bitsandbytes": bitsandbytes.__version__,
        },
        "recipe": {
            "quantization": "nf4",
            "double_quant": True,
            "compute": "fp32",
            "lora_r": 8,
            "lora_dropout": 0.05,
            "lora_targets": LORA_TARGETS,
            "optimizer": "paged_adamw_8bit",
            "attention": "sdpa",
            "batch_size": 1,
            "loss": "whole sequence, model output dropped before backward",
        },
        "isolated": True,  # one process per grid point
        "steps": args.steps,
        "runs": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for arch_name in args.arches.split(","):
        arch = ARCHES[arch_name]
        path = args.models / arch_name
        write_model(path, arch)
        for gpus in (1, 2):
            if gpus > visible:
                print(f"skipping {gpus}-GPU runs: {visible} GPU visible", file=sys.stderr)
                continue
            for seq in SEQ_LENGTHS:
                for checkpointing in (True, False):
                    run: dict[str, Any] = {
                        "arch": arch_name,
                        **arch,
                        "max_length": seq,
                        "gradient_checkpointing": checkpointing,
                        "gpus": gpus,
                    }
                    run.update(measure_point(path, arch, seq=seq, checkpointing=checkpointing, gpus=gpus, args=args))
                    record["runs"].append(run)
                    print(json.dumps(run), flush=True)
                    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The product's trainer (`python -m finetune_trainer`, the Job's command) on the 70B-shaped slice.

The slice has weights but no tokenizer; a word-level tokenizer over its whole vocabulary
(`t4`, `t5`, ... one word per id, `<s>`/`</s>` at the ids the model config names) is written
next to links to the weights, with a text dataset of random words, so every sample is exactly
`seq` tokens long. The trainer runs as a child; each progress line is time-stamped on arrival,
which gives the step times after warm-up without touching the trainer. The trainer itself
decides how many processes to start on the visible GPUs (`parallelism`: auto, dataParallel,
fsdp or deviceMap, as in a spec); `gpu_memory_gib` caps every process, as on a P40.

    python -m bench.trainer_job '{"path": SLICE, "work": DIR, "seq": 2048, "steps": 6, "gpus": 2,
                                  "parallelism": "fsdp", "gpu_memory_gib": 22.4}'
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SPECIALS = ("<unk>", "<s>", "</s>")


def write_tokenizer(folder: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = {name: index for index, name in enumerate(SPECIALS)}
    words.update({f"t{i}": i for i in range(len(SPECIALS), vocab)})
    core = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tokenizer.save_pretrained(str(folder))


def prepare(spec: dict[str, Any]) -> tuple[Path, int]:
    work = Path(spec["work"])
    # A fresh output folder: a checkpoint left by an earlier run would be resumed (by design).
    shutil.rmtree(work / "output", ignore_errors=True)
    model = work / "model"
    model.mkdir(parents=True, exist_ok=True)
    source = Path(spec["path"])
    for item in source.iterdir():
        link = model / item.name
        if not link.exists():
            link.symlink_to(item.resolve())
    config = json.loads((source / "config.json").read_text())
    write_tokenizer(model, config["vocab_size"])
    # BOS + words (+ EOS where the trainer appends one) stays within max_length.
    words = spec["seq"] - 2
    rng = random.Random(0)
    data = work / "data" / "train.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    with data.open("w") as handle:
        for _ in range(max(16, spec["steps"] * 2)):
            text = " ".join(f"t{rng.randrange(len(SPECIALS), config['vocab_size'])}" for _ in range(words))
            handle.write(json.dumps({"text": text}) + "\n")
    trainer_config = {
        "jobName": "bench-slice",
        "namespace": None,
        "spec": {
            "model": {"source": {"pvc": {"claimName": "models"}}},
            "dataset": {"source": {"pvc": {"claimName": "data", "path": "train.jsonl"}}, "format": "text"},
            "lora": {"r": 8, "alpha": 16, "dropout": 0.0},
            "precision": "fp32",
            "training": {
                "maxSteps": spec["steps"],
                "batchSize": 1,
                "gradientAccumulation": 1,
                "maxLength": spec["seq"],
                "gradientCheckpointing": spec.get("ckpt", True),
                "parallelism": spec.get("parallelism", "auto"),
                "optimizer": "paged_adamw_8bit",
                "learningRate": 1e-4,
                "lrScheduler": "constant",
                "warmupRatio": 0.0,
                "loggingSteps": 1,
            },
            "checkpoints": {"everySteps": spec["steps"], "keep": 2},
            "output": {"pvc": {"claimName": "out"}},
            "resources": {"gpus": spec.get("gpus", 1), "gpuProduct": "NVIDIA-H200"},
        },
        "paths": {"model": str(model), "dataset": str(data), "output": str(work / "output")},
    }
    path = work / "config.json"
    path.write_text(json.dumps(trainer_config))
    return path, words + 2  # BOS + words + the EOS the trainer appends


def run(spec: dict[str, Any]) -> dict[str, Any]:
    config, tokens_per_sample = prepare(spec)
    env = dict(os.environ, FINETUNE_TERMINATION_LOG=str(Path(spec["work"]) / "termination-log"))
    env.update({k: str(v) for k, v in spec.get("env", {}).items()})
    if spec.get("gpu_memory_gib"):
        env["FINETUNE_GPU_MEMORY_GIB"] = str(spec["gpu_memory_gib"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "finetune_trainer", "--config", str(config)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    stamps: list[tuple[float, dict[str, Any]]] = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        if line.startswith("{"):
            try:
                stamps.append((time.monotonic(), json.loads(line)))
            except ValueError:
                continue
    code = proc.wait()
    progress = [(t, e) for t, e in stamps if e.get("event") == "progress"]
    warm = 2
    result: dict[str, Any] = {"exit_code": code, "tokens_per_sample": tokens_per_sample}
    if len(progress) > warm + 1:
        timed = progress[warm:]
        seconds = timed[-1][0] - timed[0][0]
        steps = len(timed) - 1
        # The trainer's cumulative count of non-padding tokens, all processes together.
        tokens = timed[-1][1]["tokens"] - timed[0][1]["tokens"]
        result.update(
            tok_s=round(tokens / seconds, 1),
            step_s=round(seconds / steps, 3),
            timed_steps=steps,
            trainer_reported_tok_s=progress[-1][1].get("tokensPerSecond"),
            loss_first=progress[0][1].get("loss"),
            loss_last=progress[-1][1].get("loss"),
        )
    summary_path = Path(spec["work"]) / "output" / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        guard = summary.get("precisionGuard") or {}
        result["peak_gib"] = summary.get("peakGiBPerGpu")
        result["half_tensors"] = sum(guard.get(k, 0) for k in ("halfParameters", "halfBuffers", "halfActivations"))
        result["plan"] = (summary.get("memoryPlan") or {}).get("per_gpu_total_gib")
        result.update(
            {
                k: summary.get(k)
                for k in (
                    "peakGiBPerGpu",
                    "precisionGuard",
                    "attention",
                    "precision",
                    "hardware",
                    "finalStep",
                    "seconds",
                    "parallelism",
                    "worldSize",
                    "peakHostGiBPerProcess",
                    "peakHostAnonGiBPerProcess",
                    "loadSeconds",
                )
            }
        )
    return result


if __name__ == "__main__":
    print(json.dumps({"event": "bench-summary", **run(json.loads(sys.argv[1]))}), flush=True)

#!/usr/bin/env bash
# One run on a GPU box: the reference recipe (seed_baseline.py) and our trainer on the same
# 70B-shaped 4-layer slice, seq 2048, batch 1, gradient checkpointing, FP32, TF32 off.
# Not collected by pytest. Usage, from the repository root with the pinned venv active:
#   tests/trainer/gpu_compare.sh /path/to/seed_baseline.py [WORKDIR]
# Prints the reference's JSON line, then one JSON line with our tokens/s (steps 3..8, the
# reference also drops 2 warm-up steps), peak GiB per GPU and the precision guard's counts.
set -euo pipefail
BASELINE=${1:?path to seed_baseline.py}
W=${2:-/tmp/ftbench}
MODEL=$W/models/slice
mkdir -p "$W/datasets" "$W/outputs" "$W/models"
rm -rf "$W/outputs/slice"

python "$BASELINE" "{\"path\": \"$MODEL\",
  \"arch\": {\"layers\": 4, \"hidden\": 8192, \"inter\": 28672, \"heads\": 64, \"kv\": 8, \"vocab\": 128256},
  \"runs\": [{\"seq\": 2048, \"steps\": 6, \"warm\": 2, \"attn\": \"sdpa\", \"ckpt\": true}]}"

# The slice has no tokenizer: borrow the tiny one (ids 1/2 are <s>/</s>, as in LlamaConfig's defaults).
ftjob make-tiny-model "$W/tok" > /dev/null
cp "$W/tok/tokenizer.json" "$W/tok/tokenizer_config.json" "$W/tok/chat_template.jinja" "$MODEL/"
python - "$W/datasets/text.jsonl" <<'PY'
import json, random, sys
words = "red green blue yellow hot cold big small fast slow up down light dark open closed".split()
rng = random.Random(0)
with open(sys.argv[1], "w") as out:
    for _ in range(64):  # every sample is longer than 2048 tokens: truncation makes each step exactly 2048
        out.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(3000))}) + "\n")
PY
cat > "$W/job.yaml" <<'YAML'
apiVersion: finetune.dev/v1alpha1
kind: FineTuneJob
metadata: {name: slice}
spec:
  model: {source: {pvc: {claimName: models, path: slice}}}
  dataset: {source: {pvc: {claimName: datasets, path: text.jsonl}}, format: text}
  lora: {r: 8, alpha: 16, dropout: 0.0, targetModules: [q_proj, k_proj, v_proj, o_proj]}
  quantization: {type: nf4, doubleQuant: true}
  precision: fp32
  training: {maxSteps: 8, learningRate: 1.0e-4, warmupRatio: 0.0, batchSize: 1, gradientAccumulation: 1,
             maxLength: 2048, gradientCheckpointing: true, optimizer: paged_adamw_8bit, loggingSteps: 1}
  checkpoints: {everySteps: 1000, keep: 2}
  output: {pvc: {claimName: outputs}}
  resources: {gpus: 1, gpuProduct: NVIDIA-H200, cpu: "8"}
YAML
ftjob run "$W/job.yaml" --workdir "$W" > "$W/run.jsonl"
python - "$W" <<'PY'
import json, sys
w = sys.argv[1]
lines = [json.loads(l) for l in open(f"{w}/run.jsonl") if l.startswith("{")]
steps = {e["step"]: e for e in lines if e.get("event") == "progress"}
summary = json.load(open(f"{w}/outputs/slice/summary.json"))
a, b = steps[2], steps[max(steps)]
print(json.dumps({
    "ours_tok_s": round((b["tokens"] - a["tokens"]) / (b["elapsedSeconds"] - a["elapsedSeconds"]), 1),
    "steps_timed": max(steps) - 2, "peak_gib": summary["peakGiBPerGpu"], "guard": summary["precisionGuard"],
    "attention": summary["attention"], "loss_first": summary["firstLoss"], "loss_last": summary["finalLoss"],
}))
PY

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

With `"nodes": N`, it runs what a job of `resources.nodes: N` runs, on one machine: N launchers
(`python -m finetune_trainer`, one per pod), each on its own share of the visible GPUs (`gpus`
per node), with the environment the Indexed Job sets (`finetune_api.multinode`: the node count,
the completion index, the rendezvous on the pod of index 0). The pods' names become 127.0.0.x
addresses (no cluster DNS here); the rendezvous is TCP on 127.0.0.1; with `"socket": true` NCCL
is kept off shared memory and peer-to-peer, so the collectives also go over TCP, as between two
machines. Node 0 (global rank 0) reports; every other node writes its output elsewhere.
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


def write_byte_tokenizer(folder: Path, vocab: int) -> None:
    """A byte-level BPE without merges (one token per letter), padded to `vocab` entries.

    For families whose tokenizer class transformers picks from the model's config whatever the
    folder declares (Qwen2, Phi-3): their class rebuilds a byte-level BPE from the vocabulary, so a
    word-level vocabulary would lose every word, and a missing pad token would be added past the
    model's vocabulary. The same tokens under either class.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = [*SPECIALS, "<pad>"]
    pieces = specials + sorted(pre_tokenizers.ByteLevel.alphabet())
    words = {piece: index for index, piece in enumerate(pieces)}
    words.update({f"<unused{i}>": i for i in range(len(words), vocab)})
    core = Tokenizer(models.BPE(vocab=words, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    tokenizer.save_pretrained(str(folder))


def sample_text(rng: random.Random, words: int, vocab: int, tokenizer: str) -> str:
    """`words` tokens of random text: word-level ids, or letters for the byte-level tokenizer."""
    if tokenizer == "bytes":
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(words))
    return " ".join(f"t{rng.randrange(len(SPECIALS), vocab)}" for _ in range(words))


def preference_record(rng: random.Random, words: int, vocab: int, tokenizer: str) -> dict[str, str]:
    """A pair whose two sequences are each BOS + `words` tokens + EOS: a sixteenth of the words the
    prompt's, the rest each answer's (a leading space keeps the word-level tokens apart when TRL joins the
    prompt and the answer into one string)."""
    # Answers fill the sequence, the prompt a sixteenth (preference sets hold short prompts and
    # long answers; it is also the plan's case, every position but the prompt's scored).
    prompt = max(1, words // 16)
    answer = words - prompt
    return {
        "prompt": sample_text(rng, prompt, vocab, tokenizer),
        "chosen": " " + sample_text(rng, answer, vocab, tokenizer),
        "rejected": " " + sample_text(rng, answer, vocab, tokenizer),
    }


def completion_record(rng: random.Random, words: int, prompt: int, vocab: int, tokenizer: str) -> dict[str, str]:
    """An SFT row of `words` tokens whose first `prompt` are the prompt and the rest its reference
    answer (what the evaluation's greedy answers are scored against)."""
    return {
        "prompt": sample_text(rng, prompt, vocab, tokenizer),
        "completion": " " + sample_text(rng, words - prompt, vocab, tokenizer),
    }


def prompt_record(rng: random.Random, words: int, vocab: int, tokenizer: str) -> dict[str, str]:
    """A GRPO row (`dataset.format: prompt`): a prompt of `words` tokens, BOS before it; its
    completions are what the rollouts write."""
    return {"prompt": sample_text(rng, words, vocab, tokenizer)}


def spec_for(
    *,
    seq: int,
    steps: int,
    ckpt: bool | str = True,
    gpus: int = 1,
    parallelism: str = "auto",
    nodes: int = 1,
    every: int | None = None,
    eval_fraction: float | None = None,
    batch: int = 1,
    offload: bool | str | None = None,
    dropout: float = 0.0,
    lora: dict[str, Any] | None = None,
    method: str = "sft",
    data_format: str | None = None,
    evaluation: dict[str, Any] | None = None,
    grpo: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The FineTuneJob spec of a bench run (`every`: checkpoint steps, default the last step;
    `eval_fraction`: a held-out share evaluated at each checkpoint; `dropout`: LoRA's; `lora`: the
    whole `lora` block instead, for runs of other ranks and targets; `method`: the training
    objective, dpo and orpo reading the preference pairs `prepare` writes; `data_format`: completion
    for SFT rows with a reference answer (`completion_record`), prompt for GRPO's rows
    (`prompt_record`); `evaluation`: spec.evaluation; `grpo`: training.grpo)."""
    data_format = data_format or ("text" if method == "sft" else "preference")
    dataset: dict[str, Any] = {"source": {"pvc": {"claimName": "data", "path": "train.jsonl"}}, "format": data_format}
    if eval_fraction:
        dataset["evalFraction"] = eval_fraction
    return {
        "model": {"source": {"pvc": {"claimName": "models"}}},
        "dataset": dataset,
        "lora": lora or {"r": 8, "alpha": 16, "dropout": dropout},
        "precision": "fp32",
        "training": {
            "maxSteps": steps,
            "batchSize": batch,
            "gradientAccumulation": 1,
            "maxLength": seq,
            "gradientCheckpointing": ckpt,
            **({} if offload is None else {"activationOffload": offload}),
            "parallelism": parallelism,
            "optimizer": "paged_adamw_8bit",
            "learningRate": 1e-4,
            "lrScheduler": "constant",
            "warmupRatio": 0.0,
            "loggingSteps": 1,
            **({} if method == "sft" else {"method": method}),
            **({} if grpo is None else {"grpo": grpo}),
        },
        "checkpoints": {"everySteps": every or steps, "keep": 2},
        # A preference run writes no sample answers: minutes of generation on the slice's vocabulary;
        # nor does a run timing the evaluation, whose own answers are what it measures.
        "output": {
            "pvc": {"claimName": "out"},
            **({} if method == "sft" and evaluation is None else {"samples": {"count": 0}}),
        },
        "resources": {"gpus": gpus, "gpuProduct": "NVIDIA-H200", "nodes": nodes},
        **({"evaluation": evaluation} if evaluation is not None else {}),
    }


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
    kind = spec.get("tokenizer", "words")
    (write_byte_tokenizer if kind == "bytes" else write_tokenizer)(model, config["vocab_size"])
    # BOS + words (+ EOS where the trainer appends one) stays within max_length.
    words = spec["seq"] - 2
    rng = random.Random(0)
    data = work / "data" / "train.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    method = spec.get("method", "sft")
    data_format = spec.get("format")
    with data.open("w") as handle:
        for _ in range(spec.get("records") or max(16, spec["steps"] * 2 * spec.get("batch", 1))):
            if data_format == "completion":
                record = completion_record(rng, words, spec["prompt_words"], config["vocab_size"], kind)
            elif data_format == "prompt":
                record = prompt_record(rng, spec["prompt_words"], config["vocab_size"], kind)
            elif method == "sft":
                record = {"text": sample_text(rng, words, config["vocab_size"], kind)}
            else:
                record = preference_record(rng, words, config["vocab_size"], kind)
            handle.write(json.dumps(record) + "\n")
    trainer_config = {
        "jobName": "bench-slice",
        "namespace": None,
        "spec": spec_for(
            seq=spec["seq"],
            steps=spec["steps"],
            ckpt=spec.get("ckpt", True),
            gpus=spec.get("gpus", 1),
            parallelism=spec.get("parallelism", "auto"),
            nodes=spec.get("nodes", 1),
            every=spec.get("every"),
            eval_fraction=spec.get("eval_fraction"),
            batch=spec.get("batch", 1),
            offload=spec.get("offload"),
            dropout=spec.get("dropout", 0.0),
            lora=spec.get("lora"),
            method=method,
            data_format=data_format,
            evaluation=spec.get("evaluation"),
            grpo=spec.get("grpo"),
        ),
        "paths": {"model": str(model), "dataset": str(data), "output": str(work / "output")},
    }
    path = work / "config.json"
    path.write_text(json.dumps(trainer_config))
    return path, words + 2  # BOS + words + the EOS the trainer appends


def node_env(index: int, nodes: int, port: int, gpus_per_node: int, visible: list[str]) -> dict[str, str]:
    """The Indexed Job's environment for the pod of `index`, and that pod's share of the GPUs."""
    from finetune_api import multinode

    share = visible[index * gpus_per_node : (index + 1) * gpus_per_node]
    return {
        multinode.NNODES_ENV: str(nodes),
        multinode.NODE_RANK_ENV: str(index),
        multinode.RDZV_ENDPOINT_ENV: f"127.0.0.1:{port}",
        # `<job>-<index>.<service>` on a cluster: the same order, so node 0 is global rank 0.
        multinode.NODE_ADDR_ENV: f"127.0.0.{index + 1}",
        multinode.RDZV_TIMEOUT_ENV: "600",
        "CUDA_VISIBLE_DEVICES": ",".join(share),
    }


def node_config(config: Path, index: int) -> Path:
    """Node `index`'s copy of the trainer config: an output folder of its own (another machine's)."""
    if index == 0:
        return config
    body = json.loads(config.read_text())
    body["paths"]["output"] = str(config.parent / f"output-node-{index}")
    path = config.with_name(f"config-node-{index}.json")
    path.write_text(json.dumps(body))
    return path


def launchers(spec: dict[str, Any], config: Path, env: dict[str, str]) -> list[tuple[list[str], dict[str, str]]]:
    """(argv, env) of every launcher: one for the pod, or one per node of a multi-node job."""
    nodes = int(spec.get("nodes", 1))
    if nodes == 1:
        return [([sys.executable, "-m", "finetune_trainer", "--config", str(config)], env)]
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    per_node = int(spec.get("gpus", 1))
    if len(visible) < nodes * per_node:
        raise SystemExit(f"{nodes} nodes x {per_node} GPUs asked for, {len(visible)} visible")
    socket_only = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"} if spec.get("socket") else {}
    work = Path(spec["work"])
    out = []
    for index in range(nodes):
        node = dict(env, **socket_only, **node_env(index, nodes, port, per_node, visible))
        node["FINETUNE_TERMINATION_LOG"] = str(work / f"termination-log-node-{index}")
        out.append(([sys.executable, "-m", "finetune_trainer", "--config", str(node_config(config, index))], node))
    return out


def run(spec: dict[str, Any]) -> dict[str, Any]:
    config, tokens_per_sample = prepare(spec)
    env = dict(os.environ, FINETUNE_TERMINATION_LOG=str(Path(spec["work"]) / "termination-log"))
    env.update({k: str(v) for k, v in spec.get("env", {}).items()})
    if spec.get("gpu_memory_gib"):
        env["FINETUNE_GPU_MEMORY_GIB"] = str(spec["gpu_memory_gib"])
    started = []
    for index, (argv, node) in enumerate(launchers(spec, config, env)):
        # Node 0 holds global rank 0, which reports; the others' output goes to a file each.
        sink = subprocess.PIPE if index == 0 else (Path(spec["work"]) / f"node-{index}.out").open("w")
        started.append(subprocess.Popen(argv, stdout=sink, text=True, env=node))
    proc = started[0]
    assert proc.stdout is not None
    stamps: list[tuple[float, dict[str, Any]]] = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        if line.startswith("{"):
            try:
                stamps.append((time.monotonic(), json.loads(line)))
            except ValueError:
                continue
    codes = [p.wait() for p in started]
    code = next((c for c in codes if c != 0), 0)
    progress = [(t, e) for t, e in stamps if e.get("event") == "progress"]
    # A step is timed from the line before it: with "warm" given, the timed steps are exactly the
    # ones after the warm-up (the last warm-up step's line starts the clock); without it, the
    # first two lines are dropped, as the records before it were timed.
    warm = max(0, int(spec["warm"]) - 1) if "warm" in spec else 2
    result: dict[str, Any] = {"exit_code": code, "tokens_per_sample": tokens_per_sample}
    if len(codes) > 1:
        result["node_exit_codes"] = codes
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
    result.update(step_figures([e for _, e in progress]))
    log = Path(spec["work"]) / "termination-log"
    if log.exists():
        from finetune_api.reasons import parse_termination_message

        result["reason"], result["message"] = parse_termination_message(log.read_text())
        result["message"] = result["message"][:400]
    result.update(summary_figures(Path(spec["work"]) / "output" / "summary.json"))
    result.update(evaluation_figures(Path(spec["work"]) / "output" / "evaluation.json"))
    method = spec.get("method", "sft")
    if method != "sft" and result.get("timed_steps"):
        # Rows per optimizer step: batchSize on each process (accumulation 1), over every process;
        # a preference method's rows are pairs, GRPO's prompts (each with its G completions).
        rows = int(spec.get("batch", 1)) * int(result.get("worldSize") or 1)
        result["prompts_s" if method == "grpo" else "pairs_s"] = round(rows / result["step_s"], 4)
    return result


# What an objective reports beside the loss on each progress line and the bench keeps, step by
# step (GRPO's mean reward and its completions' mean length; other methods report neither).
STEP_FIGURES = {"reward": "rewards", "completions/mean_length": "completion_lengths"}


def step_figures(progress: list[dict[str, Any]]) -> dict[str, Any]:
    """Each kept figure of every progress line, in step order (nothing a run did not report)."""
    out: dict[str, Any] = {}
    for name, key in STEP_FIGURES.items():
        values = [line[name] for line in progress if isinstance(line.get(name), int | float)]
        if values:
            out[key] = values
    return out


def evaluation_figures(path: Path) -> dict[str, Any]:
    """What the bench keeps of the trainer's evaluation.json: the seconds of each part, the rows
    measured, the step and the figures (nothing when the run wrote none)."""
    if not path.exists():
        return {}
    found = json.loads(path.read_text())
    kept = ("seconds", "examples", "step", "split", "method", "figures")
    return {"evaluation": {**{k: found.get(k) for k in kept}, "answers": len(found.get("answers") or [])}}


def summary_figures(summary_path: Path) -> dict[str, Any]:
    """What the bench keeps of the trainer's summary.json (nothing when the run wrote none)."""
    result: dict[str, Any] = {}
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        guard = summary.get("precisionGuard") or {}
        result["peak_gib"] = summary.get("peakGiBPerGpu")
        result["half_tensors"] = sum(guard.get(k, 0) for k in ("halfParameters", "halfBuffers", "halfActivations"))
        memory_plan = summary.get("memoryPlan") or {}
        result["plan"] = memory_plan.get("per_gpu_total_gib")
        if memory_plan.get("grpo"):
            result["plan_grpo"] = memory_plan["grpo"]  # the plan's GRPO step: its rollouts, its seconds
        keys = (
            "kept_layers",
            "recomputed_layers",
            "offloaded_layers",
            "inputs_offloaded",
            "pinned_host_gib_per_process",
            "checkpointing",
            "offload",
        )
        result["activations"] = {k: memory_plan.get(k) for k in keys}
        result.update(
            {
                k: summary.get(k)
                for k in (
                    "peakGiBPerGpu",
                    "memoryParts",
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
                    "peakPinnedHostGiBPerProcess",
                    "modelBytesRead",
                    "loadSeconds",
                    "family",
                    "lora",
                )
            }
        )
    return result


if __name__ == "__main__":
    print(json.dumps({"event": "bench-summary", **run(json.loads(sys.argv[1]))}), flush=True)

"""The plan at shapes and LoRA settings no constant was fitted on, against every alternative.

Each point is a model shape (widths, heads, vocabulary, family), a depth, a sequence and batch, and
LoRA settings (rank, targets, dropout), on one GPU capped so that the plan has a choice to make
(keep, recompute or offload each layer's activations). Its random-init bf16 checkpoint is written
once on the GPU; then the pod's command (`python -m finetune_trainer`, `bench.trainer_job`) trains
it for `steps` steps in each run:

- `auto`: `gradientCheckpointing: auto`, `activationOffload: auto` (the defaults);
- `allRecompute`: every layer checkpointed, nothing offloaded;
- `keepOnly`: auto's kept layers, the rest recomputed (`activationOffload: false`);
- `offload`: auto's kept layers, the rest offloaded (`activationOffload: true`).

A run whose plan lays the layers out exactly as an earlier run's of the same point is not run
again: its row says which run it is (`sameAs`) and carries that run's figures.

Two sets: `fit` points are the ones the planner's constants may be fitted on; `heldout` points
judge the plan and never set a constant. Per run the record holds the plan (steady-state tokens/s,
allocated and total GiB, the layers' layout, host memory per process) beside what the run measured
(tokens/s after the warm-up steps, PyTorch's allocated peak, the trainer's host memory: its
anonymous peak plus its pinned allocator's, the offloaded activations), and per point `auto`'s
tokens/s over the best alternative measured.

    python -m bench.heldout            # the README's table from the committed records
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

GIB: Final = 2**30
SPEED_BAND: Final = (0.90, 1.10)  # measured steady-state tokens/s over the plan's
MEMORY_BAND: Final = (0.90, 1.00)  # measured allocated peak over the plan's allocated bytes
AUTO_FLOOR: Final = 0.97  # auto's tokens/s over the best alternative measured

# (label, gradientCheckpointing, activationOffload)
RUNS: Final = (
    ("auto", "auto", "auto"),
    ("allRecompute", True, False),
    ("keepOnly", "auto", False),
    ("offload", "auto", True),
)
ALTERNATIVES: Final = tuple(label for label, _, _ in RUNS if label != "auto")

LLAMA2_13B: Final[dict[str, Any]] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 5120,
    "intermediate_size": 13824,
    "num_attention_heads": 40,
    "num_key_value_heads": 40,
    "vocab_size": 32000,
}
LLAMA2_7B: Final[dict[str, Any]] = {**LLAMA2_13B, "hidden_size": 4096, "intermediate_size": 11008,
                                    "num_attention_heads": 32, "num_key_value_heads": 32}  # fmt: skip
LLAMA3_8B: Final[dict[str, Any]] = {
    **LLAMA2_13B,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "rope_theta": 500000.0,
}
LLAMA32_3B: Final[dict[str, Any]] = {**LLAMA3_8B, "hidden_size": 3072, "intermediate_size": 8192,
                                     "num_attention_heads": 24, "num_key_value_heads": 8}  # fmt: skip
MISTRAL_7B: Final[dict[str, Any]] = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "sliding_window": None,
}
QWEN25_14B: Final[dict[str, Any]] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 5120,
    "intermediate_size": 13824,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "vocab_size": 152064,
    "rope_theta": 1000000.0,
}
QWEN25_7B: Final[dict[str, Any]] = {**QWEN25_14B, "hidden_size": 3584, "intermediate_size": 18944,
                                    "num_attention_heads": 28, "num_key_value_heads": 4}  # fmt: skip
ALL_LINEAR: Final = ("all-linear",)
BYTE_TOKENIZER_FAMILIES: Final = frozenset({"qwen2", "phi3"})
QKVO: Final = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class Point:
    name: str
    kind: Literal["fit", "heldout"]
    config: dict[str, Any] = field(hash=False)
    layers: int
    seq: int
    batch: int
    r: int
    targets: tuple[str, ...]
    dropout: float
    cap_gib: float  # what the run's process may allocate (FINETUNE_GPU_MEMORY_GIB)

    def model_config(self) -> dict[str, Any]:
        return {**self.config, "num_hidden_layers": self.layers, "tie_word_embeddings": False,
                "bos_token_id": 1, "eos_token_id": 2, "max_position_embeddings": max(8192, self.seq)}  # fmt: skip

    def lora(self) -> dict[str, Any]:
        targets: str | list[str] = self.targets[0] if self.targets == ALL_LINEAR else list(self.targets)
        return {"r": self.r, "alpha": 2 * self.r, "dropout": self.dropout, "targetModules": targets}

    def settings(self) -> str:
        targets = "all-linear" if self.targets == ALL_LINEAR else "/".join(t.split("_")[0] for t in self.targets)
        return f"{self.seq} x {self.batch}, r={self.r} {targets}, dropout {self.dropout}"


POINTS: Final = (
    # Fit: the 8B width the speed constants were fitted on, one new setting at a time.
    Point("fit-8b-allLinear-r64", "fit", LLAMA3_8B, 6, 2048, 1, 64, ALL_LINEAR, 0.0, 12.0),
    Point("fit-8b-allLinear-r64-dropout", "fit", LLAMA3_8B, 6, 2048, 1, 64, ALL_LINEAR, 0.1, 12.0),
    Point("fit-7b-mha-vocab32k", "fit", LLAMA2_7B, 6, 2048, 2, 8, QKVO, 0.0, 12.0),
    # Held out: shapes and settings no constant was fitted on.
    Point("13b-mha-r64", "heldout", LLAMA2_13B, 8, 1024, 4, 64, ALL_LINEAR, 0.05, 14.0),
    Point("qwen14b-vocab152k", "heldout", QWEN25_14B, 6, 3072, 1, 16, ALL_LINEAR, 0.0, 12.0),
    Point("mistral7b-4096", "heldout", MISTRAL_7B, 8, 4096, 1, 16, ALL_LINEAR, 0.1, 12.0),
    Point("3b-batch2-r32", "heldout", LLAMA32_3B, 10, 2048, 2, 32, ("q_proj", "v_proj", "gate_proj"), 0.05, 10.0),
    Point("7b-mha-qv-r8", "heldout", LLAMA2_7B, 8, 2048, 1, 8, ("q_proj", "v_proj"), 0.0, 5.0),
    # Added after the adapter and offload terms (2026-12-05), on shapes none of the above has.
    Point("qwen7b-batch2-qkvo-r32", "heldout", QWEN25_7B, 8, 2048, 2, 32, QKVO, 0.1, 12.0),
    Point("7b-mha-4096-o-down-r32", "heldout", LLAMA2_7B, 8, 4096, 1, 32, ("o_proj", "down_proj"), 0.1, 9.0),
)


def build_argv(python: str, folder: Path, point: Point) -> list[str]:
    """A child that writes the point's random-init bf16 checkpoint on the GPU (families.BUILD)."""
    from bench import families

    config = {k: v for k, v in point.model_config().items() if k != "architectures"}
    return [python, "-c", families.BUILD, str(folder), json.dumps(config)]


def trainer_spec(point: Point, ckpt: bool | str, offload: bool | str, steps: int) -> dict[str, Any]:
    """The FineTuneJob spec `bench.trainer_job` writes for a run (kept in step with it)."""
    from bench.trainer_job import spec_for

    return spec_for(
        seq=point.seq, steps=steps, ckpt=ckpt, batch=point.batch, offload=offload, lora=point.lora(), gpus=1
    )


def ours_extra(point: Point, ckpt: bool | str, offload: bool | str, steps: int) -> dict[str, Any]:
    """bench.trainer_job's settings for one run (besides path, work and gpus)."""
    return {
        "seq": point.seq,
        "batch": point.batch,
        "ckpt": ckpt,
        "offload": offload,
        "steps": steps,
        "lora": point.lora(),
        "gpu_memory_gib": point.cap_gib,
        # Qwen2's tokenizer class rebuilds a byte-level BPE from the vocabulary whatever the folder
        # declares, and a word-level one gains a token past the model's embeddings there.
        **({"tokenizer": "bytes"} if point.config["model_type"] in BYTE_TOKENIZER_FAMILIES else {}),
    }


def planned(point: Point, ckpt: bool | str, offload: bool | str, steps: int, gpu: str = "NVIDIA H200") -> Any:
    """The trainer's own launch decision for the run, on one GPU of the record's product (the
    trainer plans for the device it finds) capped as the run is."""
    from finetune_api.spec import FineTuneJobSpec
    from finetune_plan import choose

    return choose(
        FineTuneJobSpec.model_validate(trainer_spec(point, ckpt, offload, steps)),
        point.model_config(),
        1,
        gpu_memory_bytes=int(point.cap_gib * GIB),
        gpu_name=gpu,
        attention="memory_efficient",
    )


def layout_of(launch: Any) -> tuple[Any, ...]:
    """What decides a run's speed and memory: the same tuple, the same run."""
    s = launch.plan.summary
    return (
        s["kept_layers"],
        s["recomputed_layers"],
        s["offloaded_layers"],
        s.get("inputs_offloaded"),
        s.get("loss_chunk_tokens"),
        s.get("checkpointing"),
    )


def laid_out_as_ran(plan: Any, row: dict[str, Any]) -> bool:
    """Whether today's plan keeps, recomputes and offloads the layers as a recorded run did (the
    trainer's own count): otherwise the run measured another layout than the plan's."""
    layers = plan.layers
    return [layers.kept, layers.recomputed, layers.offloaded] == row["trainerLayers"]


def plan_row(label: str, launch: Any) -> dict[str, Any]:
    plan = launch.plan
    s = plan.summary
    return {
        "run": label,
        "fits": plan.fits,
        "planTokPerS": s["tokens_per_second"],
        "planGiB": round(plan.layout.fullest.total / GIB, 2),
        "planAllocatedGiB": round(plan.layout.fullest.allocated / GIB, 2),
        "keptLayers": s["kept_layers"],
        "recomputedLayers": s["recomputed_layers"],
        "offloadedLayers": s["offloaded_layers"],
        "inputsOffloaded": s.get("inputs_offloaded"),
        "plannedHostGiBPerProcess": s["host_gib_per_process"],
        "plannedPinnedHostGiBPerProcess": s["pinned_host_gib_per_process"],
    }


def measured_row(row: dict[str, Any], ours: dict[str, Any] | None) -> dict[str, Any]:
    """`row` (the plan) with what the pod's command measured, and the two ratios."""
    if ours is None:
        return {**row, "ran": False}
    peaks = ours.get("peak_gib") or []
    peak = max(peaks) if peaks else None
    tok = ours.get("tok_s")
    trainer = ours.get("activations") or {}
    # What the process itself holds on the host: its anonymous peak and the pinned allocator's
    # (the offloaded activations), both in the pod's memory cgroup; not the model files' pages.
    anon, pinned = ours.get("peakHostAnonGiBPerProcess"), ours.get("peakPinnedHostGiBPerProcess")
    host = round(max(anon) + max(pinned or [0.0]), 2) if anon else None
    oom = ours.get("reason") == "OutOfMemory" or "out of memory" in str(ours.get("message") or "").lower()
    return {
        **row,
        "ran": True,
        "exitCode": ours.get("exit_code"),
        "reason": ours.get("reason"),
        "message": ours.get("message"),
        "oom": oom,
        "tokPerS": tok,
        "stepS": ours.get("step_s"),
        "timedSteps": ours.get("timed_steps"),
        "speedRatio": round(tok / row["planTokPerS"], 3) if tok and row["planTokPerS"] else None,
        "measuredPeakGiB": peak,
        "memoryRatio": round(peak / row["planAllocatedGiB"], 3) if peak else None,
        "trainerLayers": [trainer.get(k) for k in ("kept_layers", "recomputed_layers", "offloaded_layers")],
        "peakHostGiBPerProcess": ours.get("peakHostGiBPerProcess"),
        "peakHostAnonGiBPerProcess": ours.get("peakHostAnonGiBPerProcess"),
        "peakPinnedHostGiBPerProcess": ours.get("peakPinnedHostGiBPerProcess"),
        "hostFootprintGiB": host,
        "hostRatio": round(host / row["plannedHostGiBPerProcess"], 3) if host else None,
        "memoryParts": ours.get("memoryParts"),
        "attention": ours.get("attention"),
        "lossFirst": ours.get("loss_first"),
        "lossLast": ours.get("loss_last"),
    }


def judge(point: Point, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One point: its runs, and whether each holds the plan's bands and auto the best's speed."""
    by = {r["run"]: r for r in rows}
    auto = by.get("auto", {})
    alternatives = [by[a]["tokPerS"] for a in ALTERNATIVES if by.get(a, {}).get("tokPerS")]
    best = max(alternatives) if alternatives else None
    auto_ratio = round(auto["tokPerS"] / best, 3) if best and auto.get("tokPerS") else None
    ran = [r for r in rows if r.get("ran") and not r.get("sameAs")]
    speed_ok = all(r.get("speedRatio") and SPEED_BAND[0] <= r["speedRatio"] <= SPEED_BAND[1] for r in ran)
    memory_ok = all(r.get("memoryRatio") and MEMORY_BAND[0] <= r["memoryRatio"] <= MEMORY_BAND[1] for r in ran)
    return {
        "point": point.name,
        "set": point.kind,
        "model": point.config["model_type"],
        "hidden": point.config["hidden_size"],
        "heads": point.config["num_attention_heads"],
        "kvHeads": point.config["num_key_value_heads"],
        "vocab": point.config["vocab_size"],
        "layers": point.layers,
        "seq": point.seq,
        "batch": point.batch,
        "lora": point.lora(),
        "capGiB": point.cap_gib,
        "runs": rows,
        "autoOverBest": auto_ratio,
        "holds": {
            "speed": bool(ran) and speed_ok,
            "memory": bool(ran) and memory_ok,
            "noOom": bool(ran) and not any(r.get("oom") for r in ran),
            "auto": auto_ratio is not None and auto_ratio >= AUTO_FLOOR,
        },
    }


HEADER: Final = (
    "| point | set | shape | settings | run | kept / recomputed / offloaded | tok/s measured / planned "
    "| peak / plan allocated GiB | host GiB, anonymous + pinned (planned) | auto / best |\n"
    "| --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |"
)


def _shape(point: dict[str, Any]) -> str:
    attention = "MHA" if point["heads"] == point["kvHeads"] else f"GQA {point['heads']}/{point['kvHeads']}"
    return f"{point['model']} {point['hidden']}, {attention}, vocab {point['vocab'] // 1000}k, {point['layers']} layers"


def _settings(point: dict[str, Any]) -> str:
    lora = point["lora"]
    targets = lora["targetModules"]
    targets = targets if isinstance(targets, str) else "/".join(t.split("_")[0] for t in targets)
    rank = f"r={lora['r']} {targets}, dropout {lora['dropout']}"
    return f"{point['seq']} x {point['batch']}, {rank}, cap {point['capGiB']}"


def _ratio(measured: float | None, planned: float | None, ratio: float | None) -> str:
    if measured is None:
        return f"- / {planned}"
    return f"{measured} / {planned} ({ratio})"


def table(record: dict[str, Any]) -> str:
    lines = [HEADER]
    for point in record.get("points", []):
        for row in point["runs"]:
            if row.get("sameAs"):
                figures = f"as {row['sameAs']} | | | |"
            elif not row.get("ran"):
                figures = "not run | | | |"
            else:
                failure = row.get("reason") or f"exit {row['exitCode']}"
                failed = "" if row.get("exitCode") == 0 else f" **{failure}**"
                host = row.get("hostFootprintGiB")
                figures = (
                    f"{_ratio(row.get('tokPerS'), row['planTokPerS'], row.get('speedRatio'))}{failed} "
                    f"| {_ratio(row.get('measuredPeakGiB'), row['planAllocatedGiB'], row.get('memoryRatio'))} "
                    f"| {'-' if host is None else host} ({row['plannedHostGiBPerProcess']}) "
                    f"| {point.get('autoOverBest') or '-' if row['run'] == 'auto' else ''} |"
                )
            lines.append(
                f"| {point['point']} | {point['set']} | {_shape(point)} | {_settings(point)} | {row['run']} "
                f"| {row['keptLayers']} / {row['recomputedLayers']} / {row['offloadedLayers']} | {figures}"
            )
    return "\n".join(lines)


RESULTS: Final = Path(__file__).resolve().parent / "results"
# The held-out points as the README shows them: the record of each call in order, a point run again
# in a later call replacing the earlier (the first call's Qwen2 runs failed on the bench's own
# word-level tokenizer, one token past the model's vocabulary, before training).
README_RECORDS: Final = ("2026-12-05-h200-heldout-heldout-a.json", "2026-12-05-h200-heldout-heldout-b.json")


def combined(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One record of the points of `records`, a later record's point replacing an earlier one's."""
    points: dict[str, dict[str, Any]] = {}
    for record in records:
        points.update({p["point"]: p for p in record.get("points", [])})
    return {"points": list(points.values())}


def readme_table() -> str:
    return table(combined([json.loads((RESULTS / name).read_text()) for name in README_RECORDS]))


REPLANNED_HEADER: Final = (
    "| point | run | kept / recomputed / offloaded | tok/s measured over planned: then / today | "
    "peak over plan allocated: then / today |\n| --- | --- | --- | ---: | ---: |"
)


def replanned_table(records: list[dict[str, Any]] | None = None) -> str:
    """The README's runs against today's plan for the same settings on the record's GPU: speed and
    memory ratios as planned when they ran and as planned now. A run whose layers today's plan
    lays out otherwise is shown as such, without ratios (it measured another layout)."""
    record = combined(records or [json.loads((RESULTS / name).read_text()) for name in README_RECORDS])
    by_name = {p.name: p for p in POINTS}
    settings = {label: (ckpt, offload) for label, ckpt, offload in RUNS}
    lines = [REPLANNED_HEADER]
    for point in record["points"]:
        for row in point["runs"]:
            if row.get("sameAs") or not row.get("ran") or not row.get("tokPerS"):
                continue
            ckpt, offload = settings[row["run"]]
            plan = planned(by_name[point["point"]], ckpt, offload, 5, point.get("gpu") or "NVIDIA H200").plan
            s = plan.summary
            ran = " / ".join(str(n) for n in row["trainerLayers"])
            if not laid_out_as_ran(plan, row):
                today = f"{plan.layers.kept} / {plan.layers.recomputed} / {plan.layers.offloaded}"
                lines.append(f"| {point['point']} | {row['run']} | {ran} | today: {today} | |")
                continue
            tok, peak = row["tokPerS"], row["measuredPeakGiB"]
            speed_now = round(tok / s["tokens_per_second"], 3)
            memory_now = round(peak / round(plan.layout.fullest.allocated / GIB, 2), 3)
            lines.append(
                f"| {point['point']} | {row['run']} | {ran} | {row['speedRatio']} / {speed_now} "
                f"| {row['memoryRatio']} / {memory_now} |"
            )
    return "\n".join(lines)


def main() -> None:
    for path in sorted(RESULTS.glob("*-heldout*.json")):
        print(f"{path.name}\n\n{table(json.loads(path.read_text()))}\n")
    print(f"README ({', '.join(README_RECORDS)})\n\n{readme_table()}\n\nToday's plan\n\n{replanned_table()}")


if __name__ == "__main__":
    sys.exit(main())

"""`make bench`: the reference recipe and the product's trainer, same shape, same GPUs, one call.

Ours is always `python -m finetune_trainer --config FILE`, the Job's command (`bench.trainer_job`):
the trainer starts its own processes, so a benchmark times exactly what a pod runs.
Everything runs as child processes of this one (one process tree), each GPU job in its own
process so one's memory never shows in the other's peak:
  1. the FP32 matmul peak of every visible GPU (shared fp32_peak.py, TF32 off);
  2. the 70B-shaped slice written once (the reference's own builder), then for each GPU count:
     the reference (shared seed_baseline.py; layers split over the GPUs when there are several)
     and ours in each mode (1 GPU: auto; N GPUs: dataParallel, fsdp, fsdp with
     NCCL_P2P_DISABLE=1); results to bench/results/<date>-<gpu>-<n>gpu.json;
  3. `large`: a slice deeper than one P40 holds (`--large-layers`), every process capped at
     22.4 GiB: the reference split over the GPUs against ours in fsdp;
  4. optional phases: ours without checkpointing, per-layer memory for the planner, the
     planner's calibration;
  5. `boundary` (not in the default list): shapes at the planner's edge under a P40's cap, the
     pod's command for each, plan against measured peak and OOM or not (bench/boundary.py):
     <date>-<gpu>-boundary.json;
  6. `streamed` (not in the default list): fsdp's streamed loader against the loader before it on
     the `--large-layers` slice (bench/streamed_load.py: bit for bit, anonymous host memory,
     bytes read, load seconds), then the pod's command on that slice (fsdp capped at 22.4 GiB on
     2 GPUs or more; on one GPU the single process, uncapped): <date>-<gpu>-<n>gpu-<L>l-streamed.json;
  7. `recompute` (not in the default list): `gradientCheckpointing: auto` against every layer
     recomputed, through the pod's command, in one call: Llama-3.1-8B's shape (32 layers) capped at
     22.4 GiB and the 4-layer 70B slice uncapped (bench/recompute.py): <date>-<gpu>-recompute.json;
  8. `parts` (not in the default list): the plan part by part (resident, activations, the
     backward's and the loss's transients) against the trainer's phase probe, shallow slices
     through the pod's command (bench/parts.py): <date>-<gpu>-parts.json;
  9. `heldout` (not in the default list; one GPU): the plan at shapes and LoRA settings no
     constant was fitted on, each run as auto and as every alternative (all-recompute, keep-only,
     offload) through the pod's command, plan against measured speed, peak and host memory
     (bench/heldout.py): <date>-<gpu>-heldout.json;
  10. `multinode` (not in the default list): the launch path of a job of 2 nodes on one 2-GPU
     machine, two launchers of one GPU each meeting over TCP on 127.0.0.1 with the Indexed Job's
     environment, against the 1-GPU reference in the same call: <date>-<gpu>-2node.json;
  11. `dpo` (not in the default list; one GPU): our DPO through the pod's command against TRL's
     DPOTrainer with the seed recipe's settings on the slice, pairs per second and our peak
     against our plan, and our ORPO beside it (bench/preference.py): <date>-<gpu>-dpo.json.
  12. `serving` (not in the default list; one GPU): llama-server built with the serving image's
     CMake flags for this GPU's architecture from the pinned llama.cpp (`--serving-source`, what
     `python -m bench.serving pack` makes of the sdist), a GGUF base with a LoRA adapter against
     the merged GGUF at 1 and 8 concurrent requests, greedy tokens against PEFT's
     (bench/serving.py): <date>-<gpu>-serving.json.
  13. `evaluation` (not in the default list; one GPU): the slice trained through the pod's command
     with a held-out split and spec.evaluation on; the plan's seconds of the base pass, the tuned
     pass and both models' answers against the trainer's own (evaluation.json), with the ratios
     (bench/evaluation.py): <date>-<gpu>-evaluation.json.
  14. `grpo` (not in the default list; one GPU): our GRPO through the pod's command against TRL's
     GRPOTrainer (`use_vllm=False`) with the seed recipe's settings on the slice, the same prompts
     and reward, one prompt and its 8 completions per step: prompts per second, our peak against
     our plan, the half tensors, both mean rewards (bench/grpo.py): <date>-<gpu>-grpo.json.

    python -m bench.run --shared DIR_WITH_seed_baseline.py [--gpus 1,2] [--phases ...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.evaluation_phase import EvaluationPhase
from bench.flops import Shape
from bench.grpo import COMPLETION as GRPO_COMPLETION
from bench.grpo import LENGTH as GRPO_LENGTH
from bench.grpo_phase import GrpoPhase
from bench.plan_phases import PlanPhases
from bench.report import compare_record, environment_versions, gpu_slug
from bench.serving_phase import SERVING_SOURCE, ServingPhase
from bench.source_roots import on_path

REPO = Path(__file__).resolve().parent.parent
PHASES = (
    "compare",
    "nockpt",
    "large",
    "layers",
    "calibration",
    "multinode",
    "boundary",
    "families",
    "streamed",
    "recompute",
    "parts",
    "long",
    "heldout",
    "dpo",
    "serving",
    "evaluation",
    "grpo",
)
# Phases that need no FP32 matmul peak: run alone, they only name the GPU (saves the peak's time).
NO_PEAK_PHASES = frozenset(
    {"recompute", "parts", "boundary", "long", "heldout", "dpo", "serving", "evaluation", "grpo"}
)
# What runs without --phases: `multinode` (2 GPUs of their own), `boundary`, `families` and
# `streamed` are asked for by name.
DEFAULT_PHASES = ("compare", "nockpt", "large", "layers", "calibration")
# What a Tesla P40 gives PyTorch; the `large` phase holds every process to it.
P40_GIB = 22.4
SLICE = Shape(layers=4, hidden=8192, inter=28672, heads=64, kv=8, vocab=128256)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--shared", required=True, type=Path, help="folder holding seed_baseline.py and fp32_peak.py")
    parser.add_argument("--gpus", default="1,2", help="GPU counts to compare, e.g. 1,2")
    parser.add_argument("--layers", type=int, default=SLICE.layers)
    parser.add_argument("--large-layers", type=int, default=40, help="depth of the slice for the `large` phase")
    parser.add_argument(
        "--large-without-reference", action="store_true", help="`large`: ours only (peak and plan, no ratio)"
    )
    parser.add_argument("--boundary-points", default="", help="`boundary`: only these points (names, comma list)")
    parser.add_argument(
        "--recompute-keep-only", action="store_true", help="`recompute`: also auto with activationOffload false (8B)"
    )
    parser.add_argument("--parts-points", default="", help="`parts`: only these points (names, comma list)")
    parser.add_argument("--recompute-shapes", default="", help="`recompute`: only these shapes (names, comma list)")
    parser.add_argument("--heldout-points", default="", help="`heldout`: only these points, or `fit`/`heldout` sets")
    parser.add_argument(
        "--serving-source", type=Path, default=SERVING_SOURCE, help="`serving`: the packed llama.cpp (file or folder)"
    )
    parser.add_argument(
        "--grpo-length", type=int, default=GRPO_LENGTH, help="`grpo`: training.maxLength (prompt + completion)"
    )
    parser.add_argument(
        "--grpo-completion", type=int, default=GRPO_COMPLETION, help="`grpo`: training.grpo.maxCompletionLength"
    )
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=4, help="timed steps after warm-up")
    parser.add_argument("--warm", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--phases", default=",".join(DEFAULT_PHASES), help=f"comma list of {', '.join(PHASES)}")
    parser.add_argument("--work", type=Path, default=Path("/tmp/finetune-bench"), help="model and scratch folder")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--logs", type=Path, default=None, help="folder for each child's full output")
    parser.add_argument("--budget-s", type=float, default=3600.0, help="skip phases that would start after this")
    parser.add_argument(
        "--tag", default="", help="added to every record's name, <date>-<gpu>-<phase>-<tag>.json: a second run that day"
    )
    return parser.parse_args(argv)


class Bench(PlanPhases, ServingPhase, EvaluationPhase, GrpoPhase):
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.time()
        self.shape = Shape(**{**SLICE.__dict__, "layers": args.layers})
        self.model = args.work / f"slice-{args.layers}l"
        self.references: dict[int, dict[str, Any]] = {}
        self.logs = args.logs or args.work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        args.results.mkdir(parents=True, exist_ok=True)
        self.date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
        self.env = dict(os.environ)
        paths = on_path()
        # This process plans too (the boundary phase): the API and the planner from the checkout.
        sys.path[:0] = [p for p in paths if p not in sys.path]
        self.env["PYTHONPATH"] = os.pathsep.join([*paths, self.env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self.env["PYTHONUNBUFFERED"] = "1"

    def left_s(self) -> float:
        return self.args.budget_s - (time.time() - self.started)

    def child(self, name: str, argv: list[str], gpus: int, timeout: float = 900.0) -> list[dict[str, Any]]:
        """Run one child on the first `gpus` GPUs; return the JSON objects it printed."""
        env = dict(self.env, CUDA_VISIBLE_DEVICES=",".join(str(i) for i in range(gpus)))
        start = time.time()
        log_path = self.logs / f"{name}.log"
        with log_path.open("w") as log:
            try:
                proc = subprocess.run(
                    argv,
                    env=env,
                    cwd=REPO,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    timeout=max(30.0, min(timeout, self.left_s())),
                    check=False,
                )
                out, code = proc.stdout, proc.returncode
            except subprocess.TimeoutExpired as exc:
                out, code = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or ""), -9
            log.write("\n--- stdout ---\n" + out)
        found = []
        for raw in out.splitlines():
            line = raw.strip()
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue
        print(f"[bench] {name}: exit {code} in {time.time() - start:.0f}s, {len(found)} JSON lines", flush=True)
        if code != 0:
            tail = log_path.read_text()[-1500:]
            print(f"[bench] {name} failed; end of its log:\n{tail}", flush=True)
        return found

    def reference(
        self, runs: list[dict[str, Any]], gpus: int, name: str, model: Path | None = None, layers: int | None = None
    ) -> list[dict[str, Any]]:
        arch = {**self.arch(), "layers": layers or self.shape.layers}
        return self.child(name, self.reference_argv(runs, model or self.model, arch), gpus)

    def reference_argv(self, runs: list[dict[str, Any]], model: Path, arch: dict[str, int]) -> list[str]:
        """The reference script on `model` of `arch` (it writes the model first when absent)."""
        spec = {"path": str(model), "arch": arch, "runs": runs}
        # The reference draws its tokens from the global CUDA generator: seeded, its runs repeat.
        wrapper = (
            "import runpy, sys, torch; torch.manual_seed(int(sys.argv[1])); sys.argv = sys.argv[2:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')"
        )
        script = str(self.args.shared / "seed_baseline.py")
        return [sys.executable, "-c", wrapper, str(self.args.seed), script, json.dumps(spec)]

    def ours(
        self, gpus: int, name: str, model: Path | None = None, visible: int | None = None, **extra: Any
    ) -> dict[str, Any] | None:
        """The Job's command with `gpus` GPUs per pod on the first `visible` GPUs (default `gpus`);
        `extra` goes to bench.trainer_job."""
        spec = {
            "path": str(model or self.model),
            "work": str(self.args.work / name),
            "seq": self.args.seq,
            "steps": self.args.steps + self.args.warm,
            "gpus": gpus,
            **extra,
        }
        lines = self.child(name, self.ours_argv(spec), visible or gpus)
        return next((x for x in reversed(lines) if x.get("event") == "bench-summary"), None)

    @staticmethod
    def ours_argv(spec: dict[str, Any]) -> list[str]:
        return [sys.executable, "-m", "bench.trainer_job", json.dumps(spec)]

    def arch(self) -> dict[str, int]:
        s = self.shape
        return {
            "layers": s.layers,
            "hidden": s.hidden,
            "inter": s.inter,
            "heads": s.heads,
            "kv": s.kv,
            "vocab": s.vocab,
        }

    def write(self, name: str, record: dict[str, Any]) -> Path:
        if self.args.tag:
            name = f"{name.removesuffix('.json')}-{self.args.tag}.json"
        path = self.args.results / name
        path.write_text(json.dumps(record, indent=2) + "\n")
        print(f"[bench] wrote {path}", flush=True)
        return path

    # --- phases ---------------------------------------------------------------------------

    def peaks(self, count: int) -> list[dict[str, Any]]:
        out = []
        for index in range(count):
            env_gpu = {"CUDA_VISIBLE_DEVICES": str(index)}
            proc = subprocess.run(
                [sys.executable, str(self.args.shared / "fp32_peak.py")],
                env=dict(self.env, **env_gpu),
                capture_output=True,
                text=True,
                check=False,
                timeout=300,
            )
            line = (proc.stdout.strip().splitlines() or ["{}"])[-1]
            out.append(json.loads(line) if line.startswith("{") else {"error": proc.stderr[-400:]})
        print(f"[bench] fp32 peaks: {out}", flush=True)
        return out

    def gpu_facts(self, count: int) -> list[dict[str, Any]]:
        """Each GPU's name and memory, without measuring its peak; read in a child, as the peaks are
        (a CUDA context in this process would hold GPU memory for the whole bench)."""
        code = (
            "import json, sys, torch; print(json.dumps([{'gpu': torch.cuda.get_device_name(i), "
            "'memory_gib': torch.cuda.get_device_properties(i).total_memory / 2**30} "
            "for i in range(int(sys.argv[1]))]))"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code, str(count)], env=self.env, capture_output=True, text=True, check=False
        )
        lines = proc.stdout.strip().splitlines()
        facts = json.loads(lines[-1]) if lines and lines[-1].startswith("[") else [{"error": proc.stderr[-400:]}]
        print(f"[bench] GPUs: {facts}", flush=True)
        return list(facts)

    def build_once(self, name: str, model: Path, argv: list[str]) -> None:
        """A child that writes a random-init checkpoint to `model`, unless an earlier one did."""
        if not (model / "config.json").exists():
            self.child(name, argv, 1, timeout=300.0)

    def build(self, model: Path, layers: int) -> None:
        if (model / "config.json").exists():
            return
        self.reference([], 1, f"build-slice-{layers}l", model, layers)

    def record(
        self,
        shape: Shape,
        gpus: int,
        peaks: list[dict[str, Any]],
        versions: dict[str, Any],
        *,
        reference: dict[str, Any] | None,
        ours: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """One comparison record with this bench's settings."""
        return compare_record(
            date=self.date,
            shape=shape,
            seq=self.args.seq,
            steps=self.args.steps,
            warm=self.args.warm,
            seed=self.args.seed,
            gpus=gpus,
            peaks=peaks[:gpus],
            reference=reference,
            ours=ours,
            versions=versions,
        )

    def modes(self, gpus: int) -> list[tuple[str, dict[str, Any]]]:
        if gpus == 1:
            return [("auto", {})]
        return [
            ("dataParallel", {"parallelism": "dataParallel"}),
            ("fsdp", {"parallelism": "fsdp"}),
            # Traffic through host memory, as on P40 servers without peer-to-peer.
            ("fsdp-nop2p", {"parallelism": "fsdp", "env": {"NCCL_P2P_DISABLE": "1"}}),
        ]

    def compare(self, gpus: int, peaks: list[dict[str, Any]], versions: dict[str, Any]) -> None:
        run = {"seq": self.args.seq, "steps": self.args.steps, "warm": self.args.warm, "attn": "sdpa", "ckpt": True}
        self.reference_1gpu()
        split = None
        if gpus > 1:
            # What device_map does for a model too large for one card.
            lines = [
                x
                for x in self.reference([{**run, "split": True}], gpus, f"reference-{gpus}gpu-split")
                if "tok_s" in x or "error" in x
            ]
            split = lines[-1] if lines else None
        for label, extra in self.modes(gpus):
            if self.left_s() < 90:
                print(f"[bench] budget spent; {gpus}-GPU {label} not run", flush=True)
                continue
            ours = self.ours(gpus, f"ours-{gpus}gpu-{label}", **extra)
            record = self.record(self.shape, gpus, peaks, versions, reference=self.references.get(1), ours=ours)
            record["mode"] = label
            record["reference_split_same_call"] = split
            if "nockpt" in self.phases and gpus == 1 and self.left_s() > 120:
                record["ours_no_checkpointing"] = self.ours(gpus, f"ours-{gpus}gpu-nockpt", ckpt=False)
            suffix = "" if gpus == 1 else f"-{label}"
            self.write(f"{self.date}-{gpu_slug(peaks)}-{gpus}gpu{suffix}.json", record)

    def large(self, gpus: int, peaks: list[dict[str, Any]], versions: dict[str, Any]) -> None:
        """A slice that one P40 cannot hold: fsdp against the reference split over the same GPUs."""
        layers = self.args.large_layers
        model = self.args.work / f"slice-{layers}l"
        self.build(model, layers)
        run = {
            "seq": self.args.seq,
            "steps": self.args.steps,
            "warm": self.args.warm,
            "attn": "sdpa",
            "ckpt": True,
            "split": True,
        }
        name = f"reference-{gpus}gpu-{layers}l-split"
        lines = []
        if not self.args.large_without_reference:
            lines = [x for x in self.reference([run], gpus, name, model, layers) if "tok_s" in x or "error" in x]
        ours = self.ours(
            gpus, f"ours-{gpus}gpu-{layers}l-fsdp", model=model, parallelism="fsdp", gpu_memory_gib=P40_GIB
        )
        shape = Shape(**{**self.shape.__dict__, "layers": layers})
        record = self.record(shape, gpus, peaks, versions, reference=lines[-1] if lines else None, ours=ours)
        record["mode"] = "fsdp"
        record["gpu_memory_cap_gib"] = P40_GIB
        self.write(f"{self.date}-{gpu_slug(peaks)}-{gpus}gpu-{layers}l-fsdp.json", record)

    def streamed(self, gpus: int, peaks: list[dict[str, Any]], versions: dict[str, Any]) -> None:
        """fsdp's streamed loader on the large slice against the loader before it, then the pod's
        command on the slice: fsdp under a P40's cap where there are GPUs to shard over, else the
        single process (one GPU: what the pod runs there), uncapped."""
        layers = self.args.large_layers
        test = [sys.executable, "tests/trainer/test_streamed_load.py"]
        identity = self.child(f"streamed-load-gpu-test-{gpus}gpu", test, gpus, timeout=300.0)
        model = self.args.work / f"slice-{layers}l"
        self.build(model, layers)
        spec = {"path": str(model), "gpus": gpus, "work": str(self.args.work / "streamed-load")}
        argv = [sys.executable, "-m", "bench.streamed_load", json.dumps(spec)]
        lines = self.child(f"streamed-load-{gpus}gpu-{layers}l", argv, gpus, timeout=1500.0)
        loader = next((x for x in reversed(lines) if x.get("event") == "bench-summary"), None)
        extra: dict[str, Any] = {"parallelism": "fsdp", "gpu_memory_gib": P40_GIB} if gpus > 1 else {}
        ours = self.ours(gpus, f"ours-{gpus}gpu-{layers}l-streamed", model=model, **extra)
        shape = Shape(**{**self.shape.__dict__, "layers": layers})
        record = self.record(shape, gpus, peaks, versions, reference=None, ours=ours)
        record["mode"] = "fsdp" if gpus > 1 else "single"
        record["gpu_memory_cap_gib"] = P40_GIB if gpus > 1 else None
        record["streamed_loader"] = loader
        record["streamed_gpu_test"] = identity[-1] if identity else None
        self.write(f"{self.date}-{gpu_slug(peaks)}-{gpus}gpu-{layers}l-streamed.json", record)

    def reference_1gpu(self) -> dict[str, Any] | None:
        """The 1-GPU reference of this call (run once, shared by the phases that compare with it)."""
        if 1 not in self.references:
            run = {"seq": self.args.seq, "steps": self.args.steps, "warm": self.args.warm, "attn": "sdpa", "ckpt": True}
            lines = [x for x in self.reference([run], 1, "reference-1gpu") if "tok_s" in x or "error" in x]
            if lines:
                self.references[1] = lines[-1]
        return self.references.get(1)

    def multinode_spec(self, nodes: int = 2) -> dict[str, Any]:
        """bench.trainer_job's settings for a job of `nodes` pods of one GPU each."""
        # dataParallel is what `auto` runs on a pod of one GPU; named, so the record says it.
        return {"nodes": nodes, "parallelism": "dataParallel", "socket": True}

    def multinode(self, peaks: list[dict[str, Any]], versions: dict[str, Any], nodes: int = 2) -> None:
        """A job of `nodes` pods on one machine, one GPU each, through the product's launch path."""
        self.build(self.model, self.args.layers)
        reference = self.reference_1gpu()
        ours = self.ours(1, f"ours-{nodes}node", visible=nodes, **self.multinode_spec(nodes))
        record = self.record(self.shape, nodes, peaks, versions, reference=reference, ours=ours)
        record["mode"] = f"{nodes} nodes x 1 GPU, dataParallel"
        record["nodes"] = nodes
        record["launch"] = (
            f"{nodes} x `python -m finetune_trainer`, CUDA_VISIBLE_DEVICES one GPU each, the Indexed Job's "
            "environment (finetune_api.multinode), c10d rendezvous on 127.0.0.1, NCCL over TCP "
            "(NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1)"
        )
        self.write(f"{self.date}-{gpu_slug(peaks)}-{nodes}node.json", record)

    def dpo(self, peaks: list[dict[str, Any]], versions: dict[str, Any]) -> None:
        """TRL's DPOTrainer, then ours (DPO, then ORPO), on the slice, one pair per step."""
        from bench import preference
        from bench.trainer_job import prepare

        self.build(self.model, self.args.layers)
        steps = self.args.steps + self.args.warm
        work = self.args.work / "dpo"
        spec = {"path": str(self.model), "work": str(work), "seq": self.args.seq, "steps": steps, "method": "dpo"}
        prepare(spec)  # the model links, the tokenizer and the pairs both sides read
        argv = [
            sys.executable,
            "-m",
            "bench.trl_dpo",
            json.dumps({**spec, "steps": self.args.steps, "warm": self.args.warm}),
        ]
        trl = next((x for x in reversed(self.child("trl-dpo", argv, 1)) if x.get("event") == "trl-dpo"), None)
        ours = self.ours(1, "ours-dpo", work=str(work), method="dpo") if self.left_s() > 60 else None
        orpo = (
            self.ours(1, "ours-orpo", work=str(self.args.work / "orpo"), method="orpo") if self.left_s() > 60 else None
        )
        record = preference.record(
            date=self.date,
            gpu=peaks[0].get("gpu"),
            seq=self.args.seq,
            steps=self.args.steps,
            warm=self.args.warm,
            versions=versions,
            trl=trl,
            dpo=ours,
            orpo=orpo,
        )
        self.write(f"{self.date}-{gpu_slug(peaks)}-dpo.json", record)
        print(f"[bench] dpo: ratio {record['ratio']}, ours {record['ours']}", flush=True)

    def layers(self, peaks: list[dict[str, Any]]) -> None:
        spec = {"path": str(self.model), "seqs": [1024, 2048]}
        lines = self.child("layer-memory", [sys.executable, "-m", "bench.layer_memory", json.dumps(spec)], 1)
        if lines:
            record = {
                "date": self.date,
                "gpu": peaks[0].get("gpu"),
                "recipe": "nf4 double-quant, fp32 compute, LoRA r=8 alpha=16 on q/k/v/o, sdpa",
                **lines[-1],
            }
            self.write(f"{self.date}-{gpu_slug(peaks)}-layer-memory.json", record)

    def calibration(self) -> None:
        script = REPO / "bench" / "calibration" / "measure.py"
        if not script.exists():
            print("[bench] bench/calibration/measure.py not present; calibration skipped", flush=True)
            return
        out = self.args.results.parent / "calibration"
        self.child(
            "calibration",
            [sys.executable, str(script), "--out", str(out / "measurements.json")],
            2,
            timeout=self.left_s(),
        )

    def run(self) -> int:
        self.phases = set(self.args.phases.split(","))
        counts = [int(n) for n in self.args.gpus.split(",") if n]
        import torch

        available = torch.cuda.device_count()
        if "multinode" in self.phases and max(counts) < 2:
            print("[bench] multinode needs --gpus 2", file=sys.stderr)
            return 2
        if available < max(counts):
            print(f"[bench] {max(counts)} GPUs asked for, {available} visible", file=sys.stderr)
            return 2
        peaks = self.peaks(max(counts)) if self.phases - NO_PEAK_PHASES else self.gpu_facts(max(counts))
        versions = environment_versions()
        if "compare" in self.phases:
            self.build(self.model, self.args.layers)
            for gpus in counts:
                if self.left_s() < 60:
                    print(f"[bench] budget spent; {gpus}-GPU comparison not run", flush=True)
                    continue
                self.compare(gpus, peaks, versions)
        for phase, action in (
            ("multinode", lambda: self.multinode(peaks, versions)),
            ("large", lambda: self.large(max(counts), peaks, versions)),
            ("streamed", lambda: self.streamed(max(counts), peaks, versions)),
            ("boundary", lambda: self.boundary(peaks, versions)),
            ("long", lambda: self.long(peaks, versions)),
            ("families", lambda: self.families(peaks, versions)),
            ("recompute", lambda: self.recompute(peaks, versions)),
            ("heldout", lambda: self.heldout(peaks, versions)),
            ("parts", lambda: self.parts(peaks, versions)),
            ("dpo", lambda: self.dpo(peaks, versions)),
            ("serving", lambda: self.serving(peaks, versions)),
            ("evaluation", lambda: self.evaluation(peaks, versions)),
            ("grpo", lambda: self.grpo(peaks, versions)),
            ("layers", lambda: self.layers(peaks)),
            ("calibration", self.calibration),
        ):
            if phase in self.phases:
                if self.left_s() < 60:
                    print(f"[bench] budget spent; phase {phase} not run", flush=True)
                    continue
                action()
        print(f"[bench] done in {time.time() - self.started:.0f}s", flush=True)
        return 0


def main(argv: list[str] | None = None) -> int:
    return Bench(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())

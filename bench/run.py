"""`make bench`: the reference recipe and our trainer, same shape, same data, same GPUs, one call.

Everything runs as child processes of this one (one process tree), each GPU job in its own
process so one's memory never shows in the other's peak:
  1. the FP32 matmul peak of every visible GPU (shared fp32_peak.py, TF32 off);
  2. the 70B-shaped slice written once (the reference's own builder), then for each GPU count:
     the reference (shared seed_baseline.py, seeded) and ours (data-parallel, one process per
     GPU) on the same tokens; results to bench/results/<date>-<gpu>-<n>gpu.json;
  3. optional phases: ours without checkpointing, packing on a realistic length mix, per-layer
     memory for the planner, the single-process trainer end to end, the planner's calibration.

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

from bench.flops import Shape
from bench.report import compare_record, environment_versions, gpu_slug

REPO = Path(__file__).resolve().parent.parent
PHASES = ("compare", "nockpt", "packing", "layers", "trainer", "calibration")
SLICE = Shape(layers=4, hidden=8192, inter=28672, heads=64, kv=8, vocab=128256)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--shared", required=True, type=Path, help="folder holding seed_baseline.py and fp32_peak.py")
    parser.add_argument("--gpus", default="1,2", help="GPU counts to compare, e.g. 1,2")
    parser.add_argument("--layers", type=int, default=SLICE.layers)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=4, help="timed steps after warm-up")
    parser.add_argument("--warm", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma list of {', '.join(PHASES)}")
    parser.add_argument("--work", type=Path, default=Path("/tmp/finetune-bench"), help="model and scratch folder")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--logs", type=Path, default=None, help="folder for each child's full output")
    parser.add_argument("--budget-s", type=float, default=3600.0, help="skip phases that would start after this")
    return parser.parse_args(argv)


class Bench:
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
        paths = [str(REPO / "trainer_image"), str(REPO / "operator"), str(REPO)]
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

    def reference(self, runs: list[dict[str, Any]], gpus: int, name: str) -> list[dict[str, Any]]:
        spec = {"path": str(self.model), "arch": self.arch(), "runs": runs}
        # The reference draws its tokens from the global CUDA generator; seeding it here (and
        # nothing else) makes its data stream the one ours replays.
        wrapper = (
            "import runpy, sys, torch; torch.manual_seed(int(sys.argv[1])); sys.argv = sys.argv[2:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')"
        )
        script = str(self.args.shared / "seed_baseline.py")
        return self.child(name, [sys.executable, "-c", wrapper, str(self.args.seed), script, json.dumps(spec)], gpus)

    def ours(self, gpus: int, name: str, **extra: Any) -> dict[str, Any] | None:
        spec = {
            "path": str(self.model),
            "seq": self.args.seq,
            "steps": self.args.steps,
            "warm": self.args.warm,
            "seed": self.args.seed,
            "ckpt": True,
            "attn": "sdpa",
            **extra,
        }
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={gpus}",
            "-m",
            "bench.ours",
            json.dumps(spec),
        ]
        lines = self.child(name, argv, gpus)
        return lines[-1] if lines else None

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

    def build(self) -> None:
        if (self.model / "config.json").exists():
            return
        self.reference([], 1, "build-slice")

    def compare(self, gpus: int, peaks: list[dict[str, Any]], versions: dict[str, Any], extras: dict[str, Any]) -> None:
        runs = [{"seq": self.args.seq, "steps": self.args.steps, "warm": self.args.warm, "attn": "sdpa", "ckpt": True}]
        if gpus > 1:
            runs[0]["split"] = True  # what device_map does for a model too large for one card
        ref_lines = [x for x in self.reference(runs, gpus, f"reference-{gpus}gpu") if "tok_s" in x or "error" in x]
        if ref_lines:
            self.references[gpus] = ref_lines[-1]
        ours = self.ours(gpus, f"ours-{gpus}gpu")
        record = compare_record(
            date=self.date,
            shape=self.shape,
            seq=self.args.seq,
            steps=self.args.steps,
            warm=self.args.warm,
            seed=self.args.seed,
            gpus=gpus,
            peaks=peaks[:gpus],
            reference=ref_lines[-1] if ref_lines else None,
            ours=ours,
            versions=versions,
        )
        record.update(extras)
        if "nockpt" in self.phases and self.left_s() > 120:
            record["ours_no_checkpointing"] = self.ours(gpus, f"ours-{gpus}gpu-nockpt", ckpt=False)
        self.write(f"{self.date}-{gpu_slug(peaks)}-{gpus}gpu.json", record)

    def packing(self, peaks: list[dict[str, Any]]) -> None:
        record: dict[str, Any] = {
            "date": self.date,
            "gpu": peaks[0].get("gpu"),
            "gpus": 1,
            "shape": self.arch(),
            "max_length": self.args.seq,
        }
        for mode in ("per_sample", "packed"):
            spec = {"path": str(self.model), "mode": mode, "samples": 96, "max_length": self.args.seq}
            lines = self.child(f"packing-{mode}", [sys.executable, "-m", "bench.packing", json.dumps(spec)], 1)
            record[mode] = lines[-1] if lines else None
        if record["per_sample"] and record["packed"]:
            record["ratio"] = round(record["packed"]["real_tok_s"] / record["per_sample"]["real_tok_s"], 3)
        self.write(f"{self.date}-{gpu_slug(peaks)}-packing.json", record)

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

    def trainer(self, peaks: list[dict[str, Any]]) -> None:
        spec = {
            "path": str(self.model),
            "work": str(self.args.work / "trainer-job"),
            "seq": self.args.seq,
            "steps": self.args.steps + self.args.warm,
        }
        lines = self.child("trainer-1gpu", [sys.executable, "-m", "bench.trainer_job", json.dumps(spec)], 1)
        summary = next((x for x in reversed(lines) if x.get("event") == "bench-summary"), None)
        reference = self.references.get(1)
        ratio = None
        if reference and summary and "tok_s" in reference and "tok_s" in summary:
            ratio = round(summary["tok_s"] / reference["tok_s"], 3)
        self.write(
            f"{self.date}-{gpu_slug(peaks)}-trainer-1gpu.json",
            {
                "date": self.date,
                "gpu": peaks[0].get("gpu"),
                "result": summary,
                "reference_same_call": reference,
                "ratio_to_reference": ratio,
                "events": [x for x in lines if x.get("event") in ("start", "done", "checkpoint")],
            },
        )

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
        if available < max(counts):
            print(f"[bench] {max(counts)} GPUs asked for, {available} visible", file=sys.stderr)
            return 2
        peaks = self.peaks(max(counts))
        versions = environment_versions()
        self.build()
        if "compare" in self.phases:
            for gpus in counts:
                if self.left_s() < 60:
                    print(f"[bench] budget spent; {gpus}-GPU comparison not run", flush=True)
                    continue
                self.compare(gpus, peaks, versions, {})
        for phase, action in (
            ("layers", lambda: self.layers(peaks)),
            ("packing", lambda: self.packing(peaks)),
            ("trainer", lambda: self.trainer(peaks)),
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

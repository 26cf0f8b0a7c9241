"""The bench's `heldout` phase, dry-run on the CPU: every trainer config it writes is what the pod's
command reads (validated, then planned by the trainer's own `decide` on an H200 capped as the run
is) and lays the layers out as the record's plan says; a run laid out as an earlier one of its
point is not run twice; the record's judgement holds each band and fails outside it."""

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import heldout, trainer_job
from bench.run import DEFAULT_PHASES, NO_PEAK_PHASES, PHASES, Bench, parse_args
from finetune_api.trainer_config import TrainerConfig
from finetune_trainer.hardware.capabilities import Gpu, Hardware
from finetune_trainer.training.launch_plan import decide
from tests.support import docs

GIB = 2**30


def _trainer_launch(config_path: Path, cap_gib: float) -> tuple[TrainerConfig, Any]:
    config = TrainerConfig.model_validate(json.loads(config_path.read_text()))
    model_config = json.loads((Path(config.paths.model) / "config.json").read_text())
    hardware = Hardware((Gpu(0, "NVIDIA H200", (9, 0), int(cap_gib * GIB)),))
    return config, decide(config, hardware, model_config, "sdpa_expanded")  # WontFit raises here


def test_the_sets_vary_what_the_issue_asks_and_no_heldout_point_is_a_fit_point() -> None:
    held = [p for p in heldout.POINTS if p.kind == "heldout"]
    fit = {
        (p.config["hidden_size"], p.seq, p.batch, p.r, p.targets, p.dropout) for p in heldout.POINTS if p.kind == "fit"
    }
    assert held and not any((p.config["hidden_size"], p.seq, p.batch, p.r, p.targets, p.dropout) in fit for p in held)
    assert (
        {p.r for p in held} >= {8, 64} and {p.seq for p in held} >= {1024, 4096} and {p.batch for p in held} >= {1, 4}
    )
    assert {p.dropout for p in held} >= {0.0, 0.1} and {p.config["vocab_size"] for p in held} >= {32000, 152064}
    assert any(p.config["num_key_value_heads"] == p.config["num_attention_heads"] for p in held)  # MHA
    assert any(p.config["num_key_value_heads"] < p.config["num_attention_heads"] for p in held)  # GQA
    assert {p.targets for p in held} >= {heldout.ALL_LINEAR, ("q_proj", "v_proj")}


def test_the_phase_runs_each_distinct_layout_once_through_the_pods_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "heldout" in PHASES and "heldout" not in DEFAULT_PHASES and "heldout" in NO_PEAK_PHASES
    argv = ["--shared", str(tmp_path), "--work", str(tmp_path / "w"), "--results", str(tmp_path / "r")]
    bench = Bench(parse_args([*argv, "--phases", "heldout", "--heldout-points", "heldout", "--steps", "3"]))
    ran: list[str] = []

    def child(name: str, argv: list[str], gpus: int, timeout: float = 900.0) -> list[dict[str, Any]]:
        assert gpus == 1
        if name.startswith("build-"):
            assert argv[:2] == [sys.executable, "-c"]
            folder, config = Path(argv[3]), json.loads(argv[4])
            folder.mkdir(parents=True)
            (folder / "config.json").write_text(json.dumps(config))
            return [{"built": str(folder)}]
        assert argv[1:3] == ["-m", "bench.trainer_job"]
        ran.append(name)
        spec = json.loads(argv[3])
        config_path, _ = trainer_job.prepare(spec)
        config, launch = _trainer_launch(config_path, spec["gpu_memory_gib"])
        point = next(p for p in heldout.POINTS if name.startswith(f"heldout-{p.name}-"))
        label = name.removeprefix(f"heldout-{point.name}-")
        _, ckpt, offload = next(r for r in heldout.RUNS if r[0] == label)
        assert config.spec.lora.r == point.r and config.spec.training.batch_size == point.batch
        assert (config.spec.training.gradient_checkpointing, config.spec.training.activation_offload) == (ckpt, offload)
        # The record's plan is the trainer's own.
        assert heldout.layout_of(launch) == heldout.layout_of(heldout.planned(point, ckpt, offload, spec["steps"]))
        plan = launch.plan
        return [
            {
                "event": "bench-summary",
                "exit_code": 0,
                "tok_s": plan.speed.tokens_per_second,
                "peak_gib": [round(plan.layout.fullest.allocated / GIB, 2)],
                "peakHostAnonGiBPerProcess": [2.0],
                "peakPinnedHostGiBPerProcess": [plan.pinned_host_gib_per_process],
            }
        ]

    monkeypatch.setattr(bench, "child", child)
    bench.heldout([{"gpu": "NVIDIA H200"}], versions={})

    (path,) = (tmp_path / "r").glob("*-heldout.json")
    record = json.loads(path.read_text())
    held = [p for p in heldout.POINTS if p.kind == "heldout"]
    assert [p["point"] for p in record["points"]] == [p.name for p in held]
    for point in record["points"]:
        rows = {r["run"]: r for r in point["runs"]}
        assert list(rows) == [label for label, _, _ in heldout.RUNS]
        layouts = [
            (r["keptLayers"], r["recomputedLayers"], r["offloadedLayers"]) for r in point["runs"] if not r.get("sameAs")
        ]
        assert len(layouts) == len(set(layouts)) and f"heldout-{point['point']}-auto" in ran
        for row in point["runs"]:
            assert row.get("sameAs") or f"heldout-{point['point']}-{row['run']}" in ran
            assert row["speedRatio"] == 1.0 and row["memoryRatio"] == 1.0
        assert point["holds"] == {"speed": True, "memory": True, "noOom": True, "auto": point["autoOverBest"] >= 0.97}
    assert heldout.table(record).count("\n") == 1 + sum(len(p["runs"]) for p in record["points"])


def test_a_run_off_its_plan_fails_its_band() -> None:
    point = heldout.POINTS[-1]
    launch = heldout.planned(point, "auto", "auto", 5)
    row = heldout.plan_row("auto", launch)
    summary = {"exit_code": 0, "peakHostAnonGiBPerProcess": [1.0]}
    slow = heldout.measured_row(
        row, {**summary, "tok_s": row["planTokPerS"] * 0.85, "peak_gib": [row["planAllocatedGiB"]]}
    )
    over = heldout.measured_row(
        row, {**summary, "tok_s": row["planTokPerS"], "peak_gib": [row["planAllocatedGiB"] * 1.02]}
    )
    assert heldout.judge(point, [slow])["holds"]["speed"] is False
    assert heldout.judge(point, [over])["holds"]["memory"] is False
    oom = heldout.measured_row(row, {**summary, "exit_code": 3, "reason": "OutOfMemory"})
    assert heldout.judge(point, [oom])["holds"]["noOom"] is False


def test_the_host_memory_the_runs_measured_is_within_todays_plan() -> None:
    """Every committed held-out run that pinned memory: today's plan of the same layout pins at
    least what the trainer's pinned allocator held and at most 5 % more, and the process's host
    memory (anonymous peak plus pinned) stays within the plan's host figure per process."""
    settings = {label: (ckpt, offload) for label, ckpt, offload in heldout.RUNS}
    points = {p.name: p for p in heldout.POINTS}
    checked = 0
    for path in sorted(heldout.RESULTS.glob("*-heldout*.json")):
        record = json.loads(path.read_text())
        for point in record["points"]:
            for row in point["runs"]:
                pinned = max(row.get("peakPinnedHostGiBPerProcess") or [0.0])
                if row.get("sameAs") or not pinned:
                    continue
                launch = heldout.planned(points[point["point"]], *settings[row["run"]], record["steps"])
                assert heldout.layout_of(launch)[:3] == (
                    row["keptLayers"],
                    row["recomputedLayers"],
                    row["offloadedLayers"],
                )
                plan = launch.plan
                assert pinned <= plan.pinned_host_gib_per_process <= 1.05 * pinned, (
                    path.name,
                    point["point"],
                    row["run"],
                )
                assert row["hostFootprintGiB"] <= plan.host_gib_per_process, (path.name, point["point"], row["run"])
                checked += 1
    assert checked >= 5


def test_the_readme_shows_the_records_table() -> None:
    readme = docs.all_text()
    assert heldout.readme_table() in readme


def test_the_readme_shows_todays_plan_against_the_same_runs() -> None:
    readme = docs.all_text()
    assert heldout.replanned_table() in readme

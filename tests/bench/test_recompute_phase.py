"""The bench's `recompute` phase, dry-run on the CPU: every child it starts gets the arguments the
GPU run needs, each trainer config is what the pod's command reads (validated, then planned by the
trainer's own `decide` on an H200 of the run's memory), and the record and its table are written
from the children's summaries. So the device call cannot fail on an argument or a plan."""

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import recompute, trainer_job
from bench.run import DEFAULT_PHASES, NO_PEAK_PHASES, PHASES, Bench, parse_args
from finetune_api.trainer_config import TrainerConfig
from finetune_trainer.hardware.capabilities import Gpu, Hardware
from finetune_trainer.training.launch_plan import decide

H200_GIB = 139.8
GIB = 2**30


def _trainer_plan(config_path: Path, cap_gib: float | None) -> Any:
    """What the pod's command would plan for this config on one H200 (capped as the run is)."""
    config = TrainerConfig.model_validate(json.loads(config_path.read_text()))
    model_config = json.loads((Path(config.paths.model) / "config.json").read_text())
    total = int((cap_gib or H200_GIB) * GIB)
    hardware = Hardware((Gpu(0, "NVIDIA H200", (9, 0), total),))
    return config, decide(config, hardware, model_config, "sdpa_expanded")  # WontFit raises here


@pytest.mark.parametrize("keep_only", [False, True])
def test_the_phase_runs_each_shape_all_recompute_then_auto_and_writes_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep_only: bool
) -> None:
    assert "recompute" in PHASES and "recompute" not in DEFAULT_PHASES and "recompute" in NO_PEAK_PHASES
    argv = ["--shared", str(tmp_path), "--work", str(tmp_path / "w"), "--results", str(tmp_path / "r")]
    args = parse_args([*argv, "--phases", "recompute", *(["--recompute-keep-only"] if keep_only else [])])
    bench = Bench(args)
    children: list[tuple[str, list[str]]] = []
    launches: dict[str, Any] = {}

    def child(name: str, argv: list[str], gpus: int, timeout: float = 900.0) -> list[dict[str, Any]]:
        assert gpus == 1
        children.append((name, argv))
        if name.startswith("build-"):
            assert argv[:2] == [sys.executable, "-c"]
            folder, config = Path(argv[3]), json.loads(argv[4])
            folder.mkdir(parents=True)
            (folder / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
            return [{"built": str(folder)}]
        assert argv[1:3] == ["-m", "bench.trainer_job"]
        spec = json.loads(argv[3])
        config_path, _ = trainer_job.prepare(spec)
        config, launch = _trainer_plan(config_path, spec.get("gpu_memory_gib"))
        assert config.spec.training.gradient_checkpointing == spec["ckpt"]
        assert config.spec.training.activation_offload == spec["offload"]
        assert config.spec.training.max_length == 2048 and spec["steps"] == 6
        launches[name] = launch
        plan = launch.plan
        return [
            {
                "event": "bench-summary",
                "exit_code": 0,
                "tok_s": plan.speed.tokens_per_second,
                "peak_gib": [round(plan.layout.fullest.allocated / GIB, 2)],
                "plan": plan.summary["per_gpu_total_gib"],
                "activations": {k: plan.summary[k] for k in ("kept_layers", "recomputed_layers", "offloaded_layers")},
                "peakHostGiBPerProcess": 3.0,
            }
        ]

    monkeypatch.setattr(bench, "child", child)
    bench.recompute([{"gpu": "NVIDIA H200", "memory_gib": H200_GIB}], versions={})

    names = [name for name, _ in children]
    assert names == [
        "build-8b",
        "recompute-8b-allRecompute",
        "recompute-8b-auto",
        *(["recompute-8b-autoKeepOnly"] if keep_only else []),
        "build-70b-4l",
        "recompute-70b-4l-allRecompute",
        "recompute-70b-4l-auto",
    ]
    built = json.loads(children[0][1][4])
    assert (built["num_hidden_layers"], built["hidden_size"], built["vocab_size"]) == (32, 4096, 128256)
    capped = json.loads(children[1][1][3])
    assert capped["gpu_memory_gib"] == 22.4 and "gpu_memory_gib" not in json.loads(children[-1][1][3])

    [written] = list((tmp_path / "r").glob("*-h200-recompute.json"))
    record = json.loads(written.read_text())
    eight, slice70 = record["shapes"]
    assert [r["run"] for r in eight["runs"]] == ["allRecompute", "auto", *(["autoKeepOnly"] if keep_only else [])]
    # auto on the capped 8B: keeps what fits and offloads the rest, counted on the host.
    moved = eight["runs"][1]
    assert 0 < moved["keptLayers"] < 32 and moved["offloadedLayers"] == 32 - moved["keptLayers"]
    # The fused attention keeps about 0.67 GiB per 8B layer at 2048 tokens: 14 layers offloaded.
    assert moved["recomputedLayers"] == 0 and moved["plannedPinnedHostGiBPerProcess"] > 5
    assert moved["plannedHostGiBPerProcess"] > eight["runs"][0]["plannedHostGiBPerProcess"] + 5
    assert launches["recompute-8b-auto"].plan.summary["offloaded_layers"] == moved["offloadedLayers"]
    if keep_only:
        kept = eight["runs"][2]
        assert kept["offloadedLayers"] == 0 and 0 < kept["keptLayers"] < 32
        assert eight["keepOnlyRatio"] > 1.0
    assert eight["runs"][0]["recomputedLayers"] == 32
    assert slice70["runs"][1]["recomputedLayers"] == 0  # the uncapped slice keeps every layer
    for shape in record["shapes"]:
        assert shape["ratio"] > 1.0 and shape["plannedRatio"] > 1.0
        for row in shape["runs"]:
            # The planner here and the trainer's decide agree on the run.
            assert row["trainerKeptLayers"] == row["keptLayers"]
            assert row["measuredOverPlanAllocated"] == pytest.approx(1.0, abs=0.01)
    assert "| 8b @ 22.4 | auto |" in recompute.table(record)


def test_without_peaks_the_gpus_are_named_by_a_child(tmp_path: Path) -> None:
    """The recompute phase alone measures no FP32 peak; the GPU's name and memory come from a child
    (none on this machine: an empty list, not an error)."""
    args = parse_args(["--shared", str(tmp_path), "--work", str(tmp_path / "w"), "--results", str(tmp_path / "r")])
    assert Bench(args).gpu_facts(0) == []

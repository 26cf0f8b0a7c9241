"""The bench's `evaluation` phase, dry-run on the CPU: the trainer config it writes is what the pod's
command reads (validated, planned by the trainer's own `decide` on an H200), with a held-out split,
completion rows whose prompts are the record's, and spec.evaluation on; the record's plan is the
planner's evaluation time on that same plan; the trainer's evaluation.json seconds reach the record
through bench.trainer_job; and a measured sum outside 15 % of the plan fails the band."""

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import evaluation, trainer_job
from bench.run import DEFAULT_PHASES, NO_PEAK_PHASES, PHASES, Bench, parse_args
from finetune_api.trainer_config import TrainerConfig
from finetune_plan.evaluation import evaluation_time
from finetune_trainer.data.loading import split
from finetune_trainer.hardware.capabilities import Gpu, Hardware
from finetune_trainer.training.launch_plan import decide

GIB = 2**30
H200_GIB = 139.8


def _slice_config(arch: dict[str, int]) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": arch["hidden"],
        "intermediate_size": arch["inter"],
        "num_hidden_layers": arch["layers"],
        "num_attention_heads": arch["heads"],
        "num_key_value_heads": arch["kv"],
        "vocab_size": arch["vocab"],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
    }


@pytest.fixture(scope="module")
def phase(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One dry run of the phase (writing the tokenizer and data once): what each child got, and
    the record. The fake trainer writes evaluation.json with each part at 1.1 x the plan."""
    tmp = tmp_path_factory.mktemp("evaluation")
    argv = ["--shared", str(tmp), "--work", str(tmp / "w"), "--results", str(tmp / "r")]
    bench = Bench(parse_args([*argv, "--phases", "evaluation", "--steps", "2", "--warm", "1", "--seq", "512"]))
    seen: dict[str, Any] = {"children": []}

    def child(name: str, argv: list[str], gpus: int, timeout: float = 900.0) -> list[dict[str, Any]]:
        assert gpus == 1
        seen["children"].append(name)
        if name.startswith("build-"):
            spec = json.loads(argv[-1])
            folder = Path(spec["path"])
            folder.mkdir(parents=True)
            (folder / "config.json").write_text(json.dumps(_slice_config(spec["arch"])))
            return []
        assert argv[1:3] == ["-m", "bench.trainer_job"]
        spec = json.loads(argv[3])
        config_path, _ = trainer_job.prepare(spec)
        config = TrainerConfig.model_validate(json.loads(config_path.read_text()))
        model_config = json.loads((Path(config.paths.model) / "config.json").read_text())
        hardware = Hardware((Gpu(0, "NVIDIA H200", (9, 0), int(H200_GIB * GIB)),))
        launch = decide(config, hardware, model_config, "sdpa_expanded")
        rows = [json.loads(line) for line in Path(config.paths.dataset).read_text().splitlines()]
        held = len(split(rows, config.spec.dataset.eval_fraction, config.spec.training.seed)[1])
        timed = evaluation_time(
            launch.plan, config.spec, held, total_steps=spec["steps"], prompt_tokens=evaluation.prompt_words(512) + 1
        )
        seen.update(config=config, rows=rows, held=held, timed=timed)
        output = Path(spec["work"]) / "output"
        output.mkdir(parents=True, exist_ok=True)
        parts = {p: round(1.1 * getattr(timed, p), 3) for p in evaluation.PARTS}
        written = {"version": 1, "examples": held, "step": spec["steps"], "seconds": parts, "answers": [{}] * 4}
        (output / "evaluation.json").write_text(json.dumps(written))
        return [
            {"event": "bench-summary", "exit_code": 0, **trainer_job.evaluation_figures(output / "evaluation.json")}
        ]

    bench.child = child  # type: ignore[method-assign]
    bench.evaluation([{"gpu": "NVIDIA H200"}], versions={})
    (path,) = (tmp / "r").glob("*-evaluation.json")
    seen["record"] = json.loads(path.read_text())
    return seen


def test_the_phase_is_named_and_trains_the_slice_with_a_held_out_split_and_the_evaluation_on(
    phase: dict[str, Any],
) -> None:
    assert "evaluation" in PHASES and "evaluation" not in DEFAULT_PHASES and "evaluation" in NO_PEAK_PHASES
    assert phase["children"] == ["build-slice-4l", "ours-evaluation"]
    spec = phase["config"].spec
    assert spec.dataset.format == "completion" and spec.dataset.eval_fraction == evaluation.EVAL_FRACTION
    assert spec.evaluation.base and spec.evaluation.generate.count == evaluation.GENERATE["count"]
    assert spec.evaluation.generate.max_new_tokens == evaluation.GENERATE["maxNewTokens"]
    assert spec.output.samples.count == 0  # the evaluation's answers are the only ones timed
    # Every row is seq tokens: BOS, the prompt's words and the answer's, EOS.
    rows = phase["rows"]
    assert len(rows) == evaluation.RECORDS and phase["held"] == evaluation.held_out_rows()
    assert {len(r["prompt"].split()) for r in rows} == {evaluation.prompt_words(512)}
    assert {len(r["prompt"].split()) + len(r["completion"].split()) for r in rows} == {510}


def test_the_record_holds_the_trainers_plan_against_its_seconds(phase: dict[str, Any]) -> None:
    record, timed = phase["record"], phase["timed"]
    for part in evaluation.PARTS:
        assert record["plan"][part] == pytest.approx(getattr(timed, part), abs=1e-3)
        assert record["ratio"][part] == pytest.approx(1.1, abs=2e-3)
    assert record["plan"]["total"] == pytest.approx(timed.measured, abs=2e-3)
    assert record["measured"]["total"] == pytest.approx(1.1 * timed.measured, rel=1e-3)
    assert record["withinBand"] is True and record["ours"]["examples"] == phase["held"]
    assert record["ours"]["answers"] == 4 and record["heldOutRows"] == phase["held"]
    assert evaluation.table(record).count("\n") == 1 + len(evaluation.PARTS) + 1


def test_a_sum_off_the_plan_by_more_than_15_percent_fails_the_band(phase: dict[str, Any]) -> None:
    plan = phase["record"]["plan"]

    def judged(factor: float) -> Any:
        seconds = {p: plan[p] * factor for p in evaluation.PARTS}
        ours = {"exit_code": 0, "evaluation": {"seconds": seconds}}
        return evaluation.record(date="d", gpu="g", seq=512, steps=3, layers=4, versions={}, plan=plan, ours=ours)[
            "withinBand"
        ]

    assert judged(1.14) is True and judged(0.86) is True
    assert judged(1.2) is False and judged(0.8) is False
    # A run that wrote no evaluation.json (it failed) has no verdict, not a pass.
    failed = evaluation.record(date="d", gpu="g", seq=512, steps=3, layers=4, versions={}, plan=plan, ours=None)
    assert failed["withinBand"] is None and failed["measured"]["total"] is None
    assert trainer_job.evaluation_figures(Path(sys.prefix) / "no-such-evaluation.json") == {}

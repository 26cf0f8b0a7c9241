"""The bench's `grpo` phase, dry-run on the CPU: TRL's child gets the GRPO block's own settings
(one prompt and its G completions per step, no vLLM) and the prompts and tokenizer ours trains
on; our trainer config is what the pod's command reads (validated, planned by the trainer's own
`decide` on an H100), with every prompt exactly the longest the plan plans; the record holds our
peak against that plan's allocated part, the ratio of prompts per second and the half tensors,
each judged against issue 55's thresholds; and TRL's reward function scores as our `format`
reward does."""

import json
from pathlib import Path
from typing import Any

import pytest

from bench import grpo, trainer_job
from bench.boundary import plan_allocated_gib
from bench.run import DEFAULT_PHASES, NO_PEAK_PHASES, PHASES, Bench, parse_args
from finetune_api.trainer_config import TrainerConfig
from finetune_trainer.data.prompts import prompt_ids
from finetune_trainer.hardware.capabilities import Gpu, Hardware
from finetune_trainer.objectives.grpo.rewards import Completions, parse_rewards
from finetune_trainer.training.launch_plan import decide
from tests.bench.test_evaluation_phase import _slice_config

GIB = 2**30
H100 = ("NVIDIA H100 80GB HBM3", 79.2)
LENGTH, COMPLETION = 512, 64


@pytest.fixture(scope="module")
def phase(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One dry run of the phase: what each child got, and the record. The fake trainer peaks at
    0.95 of its plan's allocated part and runs 1.1x TRL's prompts per second."""
    tmp = tmp_path_factory.mktemp("grpo")
    argv = ["--shared", str(tmp), "--work", str(tmp / "w"), "--results", str(tmp / "r"), "--phases", "grpo"]
    bench = Bench(parse_args([*argv, "--steps", "3", "--warm", "1"]))
    seen: dict[str, Any] = {"children": []}

    def child(name: str, argv: list[str], gpus: int, timeout: float = 900.0) -> list[dict[str, Any]]:
        assert gpus == 1
        seen["children"].append(name)
        spec = json.loads(argv[-1])
        if name.startswith("build-"):
            folder = Path(spec["path"])
            folder.mkdir(parents=True)
            (folder / "config.json").write_text(json.dumps(_slice_config(spec["arch"])))
            return []
        if name == "trl-grpo":
            assert argv[1:3] == ["-m", "bench.trl_grpo"]
            work = Path(spec["work"])
            seen["trl"] = spec
            seen["trl_data"] = (work / "data" / "train.jsonl").read_text()  # written before TRL starts
            return [{"event": "trl-grpo", "prompts_s": 0.2, "step_s": 5.0, "rewards": [0.5, 0.25], "half_params": []}]
        assert argv[1:3] == ["-m", "bench.trainer_job"]
        config_path, _ = trainer_job.prepare(spec)
        config = TrainerConfig.model_validate(json.loads(config_path.read_text()))
        model_config = json.loads((Path(config.paths.model) / "config.json").read_text())
        hardware = Hardware((Gpu(0, H100[0], (9, 0), int(H100[1] * GIB)),))
        launch = decide(config, hardware, model_config, "sdpa_expanded")
        plan = launch.plan
        assert plan is not None and plan.grpo is not None
        total = round(plan.per_gpu[0].total / GIB, 2)
        seen.update(spec=spec, config=config, plan=plan, data=Path(config.paths.dataset).read_text())
        summary = {
            "event": "bench-summary",
            "exit_code": 0,
            "prompts_s": 0.22,
            "step_s": 4.545,
            "timed_steps": 3,
            "rewards": [0.375, 0.5, 0.625, 0.5],
            "peak_gib": [round(0.95 * plan_allocated_gib(total), 2)],
            "plan": {"cuda:0": total},
            "plan_grpo": plan.grpo.to_dict(),
            "half_tensors": 0,
        }
        return [summary]

    bench.child = child  # type: ignore[method-assign]
    bench.grpo([{"gpu": H100[0]}], versions={})
    (path,) = (tmp / "r").glob("*-grpo.json")
    seen["record"] = json.loads(path.read_text())
    return seen


def test_the_phase_is_named_and_runs_trl_then_ours_on_the_slice(phase: dict[str, Any]) -> None:
    assert "grpo" in PHASES and "grpo" not in DEFAULT_PHASES and "grpo" in NO_PEAK_PHASES
    assert phase["children"] == ["build-slice-4l", "trl-grpo", "ours-grpo"]
    # Both sides read one work folder: the same prompts, the same tokenizer.
    assert phase["trl"]["work"] == phase["spec"]["work"]
    assert phase["trl_data"] == phase["data"]
    assert phase["trl"]["steps"] == 3 and phase["trl"]["warm"] == 1
    assert phase["spec"]["steps"] == 4 and phase["spec"]["warm"] == 1  # ours: warm-up and timed steps


def test_trl_trains_with_the_grpo_blocks_own_settings(phase: dict[str, Any]) -> None:
    settings, block = phase["trl"]["trl"], phase["config"].spec.training.method_settings
    assert block is not None
    assert {k: settings[k] for k in block.as_settings()} == block.as_settings()
    assert settings["num_generations"] == settings["per_device_train_batch_size"] == grpo.GENERATIONS
    assert settings["generation_batch_size"] == grpo.GENERATIONS and settings["gradient_accumulation_steps"] == 1
    assert settings["use_vllm"] is False and settings["loss_type"] == "dapo" and settings["beta"] == 0.0
    assert settings["max_completion_length"] == COMPLETION and settings["num_iterations"] == 1
    assert phase["trl"]["reward"] == grpo.REWARD == block.reward_settings()[0]


def test_our_job_is_grpo_on_prompts_as_long_as_the_plan_plans(phase: dict[str, Any]) -> None:
    from transformers import AutoTokenizer

    spec = phase["config"].spec
    training = spec.training
    assert training.method == "grpo" and spec.dataset.format == "prompt"
    assert training.max_length == LENGTH and training.batch_size == 1 and training.gradient_accumulation == 1
    assert training.gradient_checkpointing is True and spec.precision == "fp32"
    assert spec.output.samples.count == 0
    rows = [json.loads(line) for line in phase["data"].splitlines()]
    assert len(rows) == grpo.RECORDS
    tokenizer = AutoTokenizer.from_pretrained(phase["config"].paths.model)
    lengths = {len(prompt_ids(row, tokenizer)) for row in rows}
    plan = phase["plan"]
    assert lengths == {LENGTH - COMPLETION} == {plan.grpo.prompt_tokens}
    assert plan.fits and plan.grpo.completion_tokens == COMPLETION and plan.grpo.cached


def test_the_record_judges_speed_peak_and_half_tensors(phase: dict[str, Any]) -> None:
    record = phase["record"]
    assert record["phase"] == "grpo" and record["promptTokens"] == LENGTH - COMPLETION
    assert record["ratio"] == 1.1 and record["peakOverPlan"] == pytest.approx(0.95, abs=2e-3)
    assert record["fasterThanTrl"] and record["withinBand"] and record["noHalfTensors"] and record["passed"]
    assert record["meanReward"] == {"ours": 0.5, "trl": 0.375}
    assert record["ours"]["plannedStep"]["promptTokens"] == LENGTH - COMPLETION
    assert record["ours"]["plannedPromptsPerS"] == round(1 / phase["plan"].grpo.step_seconds, 3)
    assert grpo.table(record).count("\n") == 1 + 5


@pytest.mark.parametrize(
    ("ratio", "peak", "half", "passed"),
    [
        (1.0, 0.9, 0, True),
        (1.2, 1.0, 0, True),
        (0.99, 0.95, 0, False),
        (1.1, 0.89, 0, False),
        (1.1, 1.01, 0, False),
        (1.1, 0.95, 2, False),
        (None, 0.95, 0, None),  # a side that did not run gives no verdict, not a pass
        (1.1, None, 0, None),
    ],
)
def test_each_threshold(ratio: float | None, peak: float | None, half: int | None, passed: bool | None) -> None:
    assert grpo.verdicts(ratio, peak, half)["passed"] is passed


def test_a_run_that_did_not_happen_has_no_verdict() -> None:
    record = grpo.record(
        date="d",
        gpu="g",
        layers=4,
        length=LENGTH,
        completion=COMPLETION,
        steps=4,
        warm=2,
        versions={},
        trl=None,
        ours=None,
    )
    assert record["ours"] == {"ran": False} and record["trl"] == {"ran": False}
    assert record["ratio"] is None and record["passed"] is None and record["withinBand"] is None


def test_a_completion_length_that_leaves_no_prompt_is_refused() -> None:
    assert grpo.prompt_words(LENGTH, COMPLETION) == LENGTH - COMPLETION - 1
    with pytest.raises(ValueError, match="--grpo-completion 511"):
        grpo.prompt_words(LENGTH, 511)


def test_trls_reward_function_scores_as_our_format_reward() -> None:
    texts = ["t5 t177 t9", "t770 t5", "t77", "t1770", "t3\nt4477", "", "t12 t977x"]
    ours = parse_rewards([grpo.REWARD])[0]
    batch = Completions([""] * len(texts), texts, [{}] * len(texts), count_tokens=lambda text: len(text.split()))
    theirs = grpo.format_reward(grpo.REWARD["name"], grpo.REWARD["format"]["pattern"])
    assert theirs(completions=texts, prompts=[""] * len(texts)) == list(ours.score(batch))
    assert list(ours.score(batch)) == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    assert theirs.__name__ == grpo.REWARD["name"]  # TRL logs rewards/<name>/mean, as ours does


def test_step_figures_keep_each_progress_lines_reward() -> None:
    lines = [{"step": 1, "loss": 0.1}, {"step": 2, "reward": 0.5, "completions/mean_length": 64.0}]
    assert trainer_job.step_figures(lines) == {"rewards": [0.5], "completion_lengths": [64.0]}
    assert trainer_job.step_figures([{"step": 1, "loss": 0.1}]) == {}

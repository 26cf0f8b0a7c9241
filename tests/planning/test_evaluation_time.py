"""The evaluation's time in the plan (spec.evaluation): each part against the speed model's own
terms, as the trainer runs it: a base pass of forwards without gradients, a tuned pass of training
micro-batches without the optimizer, the held-out loss at the checkpoints, the answers of both
models (a prefill and one-token forwards where the KV cache holds; under fsdp's lockstep, one
forward of the whole row per token), and nothing without a held-out split."""

from typing import Any

import pytest
import yaml

from finetune_api.spec import FineTuneJobSpec
from finetune_plan import Plan, choose
from finetune_plan import calibration as cal
from finetune_plan import evaluation as ev
from finetune_plan.speed import forward_seconds

from .models import EXAMPLE, LLAMA_3_8B


def spec(**change: Any) -> FineTuneJobSpec:
    """The 70B example's spec on the 8B model's one P40 (dataParallel of one), `change` merged in."""
    body = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))["spec"]
    body["resources"]["gpus"] = 1
    body["training"].update({"maxSteps": 100, "maxLength": 1024, "batchSize": 2})
    body["training"].pop("epochs", None)
    for key, value in change.items():
        body[key] = {**body.get(key, {}), **value}
    return FineTuneJobSpec.model_validate(body)


def plan_of(job: FineTuneJobSpec) -> Plan:
    launch = choose(job, LLAMA_3_8B, job.resources.gpus, attention="memory_efficient")
    assert launch.plan is not None and launch.plan.speed is not None
    return launch.plan


@pytest.fixture(scope="module")
def planned() -> tuple[FineTuneJobSpec, Plan]:
    job = spec(checkpoints={"everySteps": 30})
    return job, plan_of(job)


def test_each_pass_is_its_micro_batches_at_the_speed_models_rates(planned: tuple[FineTuneJobSpec, Plan]) -> None:
    job, plan = planned
    assert plan.speed is not None
    timed = ev.evaluation_time(plan, job, 9)
    assert timed is not None and timed.base is not None and timed.tuned is not None
    micro = 5  # 9 rows in micro-batches of batchSize 2, on one process
    forward = forward_seconds(plan.shape, plan.recipe, plan.hardware.product, adapters=False)
    assert timed.base == pytest.approx(micro * forward)
    accumulation = job.training.gradient_accumulation
    assert timed.tuned == pytest.approx(micro * (plan.speed.step_seconds - cal.STEP_SECONDS / accumulation))
    # A forward without gradients is well under a trained micro-batch (forward, recompute, backward).
    assert 0.15 * timed.tuned < timed.base < 0.5 * timed.tuned
    # 100 steps, a checkpoint every 30: the held-out loss at 30, 60, 90 and 100; one tuned pass after.
    assert (timed.loss_passes, timed.tuned_passes) == (4, 1)
    assert timed.measured == pytest.approx(timed.base + timed.tuned + timed.generation)
    assert timed.seconds == pytest.approx(timed.base + 5 * timed.tuned + timed.generation)


def test_the_answers_are_a_prefill_and_one_token_forwards_of_both_models(
    planned: tuple[FineTuneJobSpec, Plan],
) -> None:
    job, plan = planned
    asked = job.evaluation.generate
    timed = ev.evaluation_time(plan, job, 100, prompt_tokens=200)
    assert timed is not None and timed.generated == asked.count == 4
    # Rank 0 answers alone here (not fsdp): the KV cache holds, so one prefill of the prompt and
    # one one-token forward for every further token, for each model.
    assert ev.generation_cached(plan)
    one = sum(
        ev.row_forward_seconds(plan, 200, adapters=a)
        + (asked.max_new_tokens - 1) * ev.row_forward_seconds(plan, 1, adapters=a)
        for a in (True, False)
    )
    assert timed.generation == pytest.approx(asked.count * one)
    # The longer the prompt, the longer every token's forward; fewer held-out rows, fewer answers.
    longer = ev.evaluation_time(plan, job, 100, prompt_tokens=800)
    assert longer is not None and longer.generation > timed.generation
    few = ev.evaluation_time(plan, job, 2, prompt_tokens=200)
    assert few is not None and few.generated == 2 and few.generation == pytest.approx(2 * one)
    # A token's forward over a short row is bound by the weights' dequantisation, not the matmuls:
    # a 1-token forward costs far more than 1/200 of a 200-token one.
    assert ev.row_forward_seconds(plan, 1, adapters=True) > 20 * ev.row_forward_seconds(plan, 200, adapters=True) / 200


def test_the_spec_turns_each_part_on_and_off() -> None:
    base_off = spec(evaluation={"base": False, "atCheckpoints": True, "generate": {"count": 0}}, checkpoints={})
    plan = plan_of(base_off)
    timed = ev.evaluation_time(plan, base_off, 10)
    assert timed is not None and timed.base == 0.0 and timed.generation == 0.0 and timed.generated == 0
    # everySteps 50 (the example's) over 100 steps: the tuned model at 50 and after training.
    assert timed.tuned_passes == 2 and timed.loss_passes == 2
    # Text rows hold no reference answer: nothing to answer.
    text = spec(dataset={"format": "text"})
    timed_text = ev.evaluation_time(plan, text, 10)
    assert timed_text is not None and timed_text.generated == 0
    # No held-out split: no evaluation at all.
    none = spec(dataset={"evalFraction": None})
    assert ev.evaluation_time(plan, none, 10) is None


def test_unknown_held_out_size_leaves_the_passes_unknown_and_the_answers_planned(
    planned: tuple[FineTuneJobSpec, Plan],
) -> None:
    job, plan = planned
    timed = ev.evaluation_time(plan, job, None)
    assert timed is not None and timed.base is None and timed.seconds is None and timed.measured is None
    assert timed.generation > 0
    assert "pass --eval-examples N" in ev.describe(timed)
    known = ev.evaluation_time(plan, job, 40)
    assert known is not None
    line = ev.describe(known)
    assert line.startswith("about ") and "on 40 held-out examples: base " in line and "4 answer(s) x 2 models" in line


def test_held_out_rows_follow_the_trainers_split() -> None:
    fraction = spec(dataset={"evalFraction": 0.1})
    assert ev.held_out_examples(fraction, 1000) == 100
    assert ev.held_out_examples(fraction, 3) == 1  # at least one
    assert ev.held_out_examples(fraction, None) is None
    separate = spec(dataset={"evalFraction": None, "eval": {"pvc": {"claimName": "d", "path": "e.jsonl"}}})
    assert ev.held_out_examples(separate, 1000, 37) == 37


def test_device_map_runs_every_micro_batch_on_one_process_and_fsdp_splits_them() -> None:
    job = spec(resources={"gpus": 2}, training={"parallelism": "deviceMap"})
    plan = plan_of(job)
    assert plan.mode == "device_map" and ev.ranks(plan, job) == 1 and ev.micro_batches(9, plan, job) == 5
    split = spec(resources={"gpus": 2}, training={"parallelism": "dataParallel"})
    plan = plan_of(split)
    assert ev.ranks(plan, split) == 2 and ev.micro_batches(9, plan, split) == 3


def test_the_answers_logits_beyond_the_steps_room_are_said() -> None:
    job = spec(evaluation={"generate": {"count": 1, "maxNewTokens": 1024}})
    plan = plan_of(job)
    fits = ev.memory_note(plan, 1024 + 1024)
    assert fits is None  # 2048 positions x 128256 in FP32 = 1 GiB: within what the step leaves
    huge = ev.memory_note(plan, 200_000)
    assert huge is not None and "evaluation.generate.maxNewTokens" in huge


def test_under_fsdp_the_tuned_answer_is_a_trained_pass_and_unquantised_base_passes_run_a_backward() -> None:
    sharded = spec(resources={"gpus": 2}, training={"parallelism": "fsdp"})
    plan = plan_of(sharded)
    assert plan.mode == "fsdp"
    assert not ev.generation_cached(plan)  # the ranks answer in lockstep, without a KV cache
    tuned, base = (ev.row_forward_seconds(plan, 300, adapters=a) for a in (True, False))
    # The lockstep's zero backward: the tuned token costs a forward and a backward, the base's a forward.
    assert tuned > 2 * base
    single = plan_of(spec())
    assert ev.row_forward_seconds(single, 300, adapters=True) < 1.2 * ev.row_forward_seconds(
        single, 300, adapters=False
    )
    assert not ev.base_backward(single)
    plain = spec(quantization={"type": "none"}, training={"gradientCheckpointing": True})
    unquantised = plan_of(plain)
    assert ev.base_backward(unquantised)
    assert ev.base_micro_seconds(unquantised, 8) == ev.tuned_micro_seconds(unquantised, 8)


def test_what_is_ahead_at_a_step_counts_the_passes_and_answers_still_to_run(
    planned: tuple[FineTuneJobSpec, Plan],
) -> None:
    job, plan = planned
    timed = ev.evaluation_time(plan, job, 9)
    assert timed is not None and timed.tuned is not None
    # From step 0 everything but the base: the job's own counts.
    assert timed.ahead(0, 100, 30, at_checkpoints=False) == pytest.approx(timed.seconds - timed.base)
    # After step 95 of 100: the held-out loss at 100, the tuned pass after, the answers.
    assert timed.ahead(95, 100, 30, at_checkpoints=True) == pytest.approx(2 * timed.tuned + timed.generation)
    # With atCheckpoints from step 0: the tuned model at 30, 60 and 90 as well.
    assert timed.ahead(0, 100, 30, at_checkpoints=True) == pytest.approx(8 * timed.tuned + timed.generation)
    unknown = ev.evaluation_time(plan, job, None)
    assert unknown is not None and unknown.ahead(0, 100, 30, at_checkpoints=False) is None

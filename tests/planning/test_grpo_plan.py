"""GRPO's step in the planner (`finetune_plan.grpo`): the rollouts' KV cache and their phase's
peak beside the scored micro-batch, the reference forward's time without memory, the rollouts
shared by numIterations steps, fsdp's cacheless generation growing with the square of the
completion, and sane figures for an 8B and a 70B shape on P40s."""

import math
import re
from dataclasses import replace
from typing import Any

import pytest
import yaml

from finetune_api.spec import FineTuneJobSpec
from finetune_plan import GIB, GpuMemory, Hardware, Plan, Recipe, choose, lookup, make_plan, shape_from_config
from finetune_plan.duration import job_time
from finetune_plan.grpo import phases, timing
from finetune_plan.grpo.spec import terms_of, with_terms
from finetune_plan.grpo.step import optimizer_steps
from finetune_plan.inputs import recipe_from_spec
from finetune_plan.memory import GrpoTerms
from finetune_plan.messages.report import render
from finetune_plan.search.modes import ModeChoice
from finetune_plan.speed import Mode, forward_seconds

from .models import EXAMPLE, LLAMA_2_13B, LLAMA_3_8B, LLAMA_33_70B

P40 = lookup("Tesla-P40")
assert P40 is not None
EIGHT_B = shape_from_config(LLAMA_3_8B)
SEVENTY_B = shape_from_config(LLAMA_33_70B)
GRPO_EXAMPLE = EXAMPLE.parent / "grpo-job.yaml"


def grpo_recipe(
    length: int = 512, completion: int = 256, generations: int = 8, *, iterations: int = 1, beta: float = 0.0
) -> Recipe:
    """One prompt a micro-batch, fp32 with the trainer's fused attention, as GRPO's."""
    terms = GrpoTerms(generations, completion, iterations, beta)
    return with_terms(Recipe(max_length=length, attention="memory_efficient"), terms)


def planned(recipe: Recipe, gpus: int = 1, mode: ModeChoice = "auto", shape: Any = EIGHT_B) -> Plan:
    assert P40 is not None
    return make_plan(
        shape, recipe, Hardware(gpus, P40, 22.4), mode=mode, checkpointing="auto", offload="auto", loss_chunks=(0, 512)
    )


def independent_kv_cache(config: dict[str, Any], rows: int, tokens: int) -> int:
    """k and v, fp32, of every layer for every token of every row, from the config alone."""
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4 * rows * tokens


def test_a_grpo_recipe_scores_a_prompts_group_and_plans_the_longest_prompt() -> None:
    recipe = grpo_recipe(512, 128, 8)
    assert (recipe.batch_size, recipe.rows, recipe.sequences_per_row, recipe.tokens) == (8, 1, 8, 8 * 512)
    assert phases.row_lengths(recipe) == (384, 128)  # prompt = maxLength - maxCompletionLength
    assert recipe.reference_forwards == 0 and grpo_recipe(beta=0.04).reference_forwards == 1
    sft = Recipe(max_length=512)
    assert with_terms(sft, None) is sft


def test_the_kv_cache_grows_with_the_group_and_the_completion_as_the_config_says() -> None:
    """2 x layers x kv_heads x head_dim x 4 bytes per token per row, for G rows of P + C tokens:
    at a fixed prompt, doubling G or C adds what the config says, and the rollouts' phase grows
    by the cache and the expanded k and v of one layer (a short prompt: the last one-token forward
    is the larger phase)."""
    prompt = 64

    def recipe(generations: int, completion: int) -> Recipe:
        return grpo_recipe(prompt + completion, completion, generations)

    for generations, completion in ((8, 960), (16, 960), (8, 1984)):
        tokens = prompt + completion
        assert phases.kv_cache_bytes(EIGHT_B, recipe(generations, completion)) == independent_kv_cache(
            LLAMA_3_8B, generations, tokens
        )
    head_dim = LLAMA_3_8B["hidden_size"] // LLAMA_3_8B["num_attention_heads"]
    heads, layers = LLAMA_3_8B["num_attention_heads"], LLAMA_3_8B["num_hidden_layers"]

    def expected(generations: int, completion: int) -> float:
        cache = independent_kv_cache(LLAMA_3_8B, generations, prompt + completion)
        expanded = 2 * generations * (prompt + completion) * heads * head_dim * 4
        return cache + cache / layers + expanded  # the growing layer's copy beside the cache

    for generations, completion in ((8, 960), (16, 960), (8, 1984), (16, 1984)):
        got = phases.cached_rollout_bytes(EIGHT_B, recipe(generations, completion), layers=layers, head=True)
        assert got == pytest.approx(expected(generations, completion))
    whole = planned(recipe(16, 960))
    assert whole.grpo is not None and whole.grpo.kv_cache_bytes == independent_kv_cache(LLAMA_3_8B, 16, 1024)
    assert whole.layout.fullest.rollouts >= expected(16, 960)


def test_the_peak_is_the_larger_of_the_trained_pass_and_the_phases_without_gradients() -> None:
    gpu = GpuMemory(0, 32, 4 * GIB, 2 * GIB, 0.0, 1 * GIB, 3 * GIB, 1 * GIB, 2 * GIB, 22.4 * GIB)
    assert gpu.allocated == 7 * GIB + 3 * GIB + 2 * GIB and gpu.peak_phase == "loss"
    rollouts = replace(gpu, rollouts=9 * GIB)
    assert rollouts.allocated == 7 * GIB + 9 * GIB and rollouts.peak_phase == "rollouts"
    assert rollouts.parts_gib()["rollouts"] == 9.0 and "rollouts" not in gpu.parts_gib()
    # The forwards without gradients hold one layer at a time: never above the trained pass.
    plan = planned(grpo_recipe(1024, 256, 8))
    fullest = plan.layout.fullest
    forward = phases.scoring_forward_bytes(EIGHT_B, plan.recipe, layers=EIGHT_B.layers, head=True)
    assert 0 < forward < fullest.activations + max(fullest.temporaries, fullest.logits)


def test_the_rollouts_cache_decides_the_fit_where_the_scored_pass_alone_would_fit() -> None:
    """Llama-2-13B has a key and a value head per query head: its fp32 cache of 8 rows of 2048
    tokens is 25 GiB, more than a P40, while the scored pass fits with its layers' inputs in host
    memory. The verdict, the peak's phase, the shorter maxLength and the smaller group suggested are
    GRPO's."""
    shape = shape_from_config(LLAMA_2_13B)
    recipe = grpo_recipe(2048, 256, 8)
    assert phases.kv_cache_bytes(shape, recipe) == independent_kv_cache(LLAMA_2_13B, 8, 2048) == 25 * GIB
    alone = planned(replace(recipe, grpo=None), shape=shape)
    grpo = planned(recipe, shape=shape)
    assert alone.fits and not grpo.fits
    assert grpo.layout.fullest.peak_phase == "rollouts"
    found = next(re.search(r"maxLength <= (\d+)", line) for line in grpo.suggestions if "maxLength <=" in line)
    assert found is not None
    length = int(found.group(1))
    fitting = planned(replace(recipe, max_length=length), shape=shape)
    assert fitting.fits and 512 < length < 2048
    fewer = next(re.search(r"numGenerations <= (\d+)", line) for line in grpo.suggestions if "numGenerations" in line)
    assert fewer is not None and 2 <= int(fewer.group(1)) < 8
    group = int(fewer.group(1))
    assert planned(with_terms(recipe, GrpoTerms(group, 256)), shape=shape).fits
    assert not planned(with_terms(recipe, GrpoTerms(group + 1, 256)), shape=shape).fits


def test_beta_adds_the_reference_forwards_time_and_no_memory() -> None:
    without, with_kl = planned(grpo_recipe(512, 256, 8)), planned(grpo_recipe(512, 256, 8, beta=0.04))
    assert without.fits and with_kl.fits
    assert [g.total for g in with_kl.per_gpu] == [g.total for g in without.per_gpu]
    assert without.speed is not None and with_kl.speed is not None
    assert without.speed.reference_seconds == 0.0
    reference = forward_seconds(EIGHT_B, with_kl.recipe, P40, adapters=False)  # 8 x 512 tokens, adapter off
    assert with_kl.speed.reference_seconds == pytest.approx(reference) and reference > 0
    assert with_kl.speed.step_seconds == pytest.approx(without.speed.step_seconds + reference)
    assert with_kl.grpo is not None and with_kl.grpo.reference_seconds == pytest.approx(reference)


def test_num_iterations_shares_one_batch_of_rollouts_over_that_many_steps() -> None:
    once, four = planned(grpo_recipe(512, 256, 8)), planned(grpo_recipe(512, 256, 8, iterations=4))
    assert once.speed is not None and four.speed is not None
    assert once.speed.rollout_seconds == pytest.approx(four.speed.rollout_seconds)
    assert once.speed.rollout_seconds > 0
    assert once.speed.old_logp_seconds == 0.0  # the sampling policy is the trained one: no old forward
    old = forward_seconds(EIGHT_B, four.recipe, P40, adapters=True)
    assert four.speed.old_logp_seconds == pytest.approx(old)
    trained = once.speed.step_seconds - once.speed.rollout_seconds
    assert four.speed.step_seconds == pytest.approx(trained + (four.speed.rollout_seconds + old) / 4)
    assert four.speed.longest_seconds == pytest.approx(trained + four.speed.rollout_seconds + old)
    assert four.grpo is not None and four.grpo.generation_seconds == pytest.approx(four.speed.rollout_seconds / 4)


def test_fsdp_generates_without_a_cache_and_grows_with_the_square_of_the_completion() -> None:
    """Each new token a forward of the whole rows so far: doubling a long completion more than
    triples fsdp's rollouts, about doubles the cached ones'."""
    assert P40 is not None

    def rollouts(completion: int, mode: Mode) -> float:
        return timing.rollout_seconds(EIGHT_B, grpo_recipe(64 + completion, completion), P40, mode=mode, gpus=1)

    assert rollouts(1024, "fsdp") / rollouts(512, "fsdp") > 3.0
    assert 1.9 < rollouts(1024, "data_parallel") / rollouts(512, "data_parallel") < 2.3
    assert rollouts(512, "fsdp") > 5 * rollouts(512, "data_parallel")
    # Without a cache the rollouts hold no KV cache: on one GPU too, fsdp's rank generates in lockstep.
    lockstep, cached = planned(grpo_recipe(1024, 960), 1, "fsdp"), planned(grpo_recipe(1024, 960), 1, "data_parallel")
    assert lockstep.grpo is not None and not lockstep.grpo.cached and lockstep.grpo.kv_cache_bytes == 0
    # Its phase is the last whole-row forward, a layer's tensors for G rows of P + C tokens.
    rows = phases.rows_of(lockstep.recipe, 1024)
    assert lockstep.per_gpu[0].rollouts >= phases.layer_forward_bytes(EIGHT_B, rows) > 0
    assert cached.grpo is not None and cached.grpo.kv_cache_bytes == independent_kv_cache(LLAMA_3_8B, 8, 1024)


def test_the_whole_row_passes_are_summed_in_closed_form() -> None:
    """The closed form equals the forwards summed one by one, with and without a floor (the
    weight gathers) that the first passes fall under."""
    assert P40 is not None
    recipe = grpo_recipe(364, 300)

    def one(tokens: int) -> float:
        return forward_seconds(EIGHT_B, phases.rows_of(recipe, tokens), P40, adapters=True)

    floor = one(64 + 150)
    for low in (0.0, floor):
        direct = sum(max(one(64 + t), low) for t in range(300))
        assert timing.summed_passes(one, 64, 300, low) == pytest.approx(direct, rel=1e-9)
    gathers = 1.0
    shared = timing.uncached_prompt_seconds(EIGHT_B, recipe, P40, gathers=gathers)
    assert shared == pytest.approx(sum(max(one(64 + t), gathers) for t in range(300)), rel=1e-9)


def test_an_8b_shape_on_one_p40_gives_sane_figures() -> None:
    """8 completions of 256 tokens to a 256-token prompt: a one-token step reads the 8B's NF4
    linears dequantised (about 59 GB) at a P40's 346 GB/s, a third of a second; the rollouts are
    most of the step, and the cache is the config's 1 GiB."""
    assert P40 is not None
    plan = planned(grpo_recipe(512, 256, 8))
    step = plan.grpo
    assert plan.fits and step is not None and step.cached
    assert step.kv_cache_bytes == independent_kv_cache(LLAMA_3_8B, 8, 512) == 1 * GIB
    token = timing.token_step_seconds(EIGHT_B, plan.recipe, P40)
    dequantised = EIGHT_B.layers * EIGHT_B.linear_params_per_layer * 8.5 / (P40.memory_gbps * 1e9)
    assert dequantised < token < 3 * dequantised and 0.15 < token < 0.6
    assert 255 * token < step.rollout_seconds < 255 * token + 30  # the steps and a prefill of 2,048 tokens
    assert step.generation_seconds > step.scoring_seconds > 0
    assert step.step_seconds == pytest.approx(step.generation_seconds + step.scoring_seconds)
    assert step.prompt_tokens == step.completion_tokens == 256 and step.prompts == 1


def test_a_70b_shape_on_four_p40s_gives_sane_figures() -> None:
    """deviceMap keeps a cache, split with the layers; fsdp's lockstep forwards have none and take
    far longer to generate; both fit 4 completions of 128 tokens."""
    recipe = grpo_recipe(512, 128, 4)
    cached, lockstep = planned(recipe, 4, "device_map", SEVENTY_B), planned(recipe, 4, "fsdp", SEVENTY_B)
    assert cached.fits and lockstep.fits
    assert cached.grpo is not None and lockstep.grpo is not None
    assert cached.grpo.kv_cache_bytes == independent_kv_cache(LLAMA_33_70B, 4, 512) == 1.25 * GIB
    per_layer = cached.grpo.kv_cache_bytes / SEVENTY_B.layers
    for gpu in cached.per_gpu:
        assert gpu.rollouts >= gpu.layers * per_layer
    assert not lockstep.grpo.cached and lockstep.grpo.kv_cache_bytes == 0
    assert P40 is not None
    token = timing.token_step_seconds(SEVENTY_B, cached.recipe, P40)
    assert 1.5 < token < 4.0  # 80 layers of 0.86 B weights dequantised, over 277 GB/s, a token
    assert 127 * token < cached.grpo.rollout_seconds < 127 * (token + 0.1) + 60  # and a prefill of 4 x 384 tokens
    assert lockstep.grpo.rollout_seconds > 5 * cached.grpo.rollout_seconds
    assert all(0 < g.total <= g.capacity for g in (*cached.per_gpu, *lockstep.per_gpu))


def grpo_spec(**training: Any) -> FineTuneJobSpec:
    """The GRPO example on one P40, its training block updated with `training`."""
    body = yaml.safe_load(GRPO_EXAMPLE.read_text(encoding="utf-8"))["spec"]
    body["resources"] = {"gpus": 1, "gpuProduct": "Tesla-P40"}
    grpo = training.pop("grpo", {})
    body["training"].update(training)
    body["training"]["grpo"].update(grpo)
    return FineTuneJobSpec.model_validate(body)


def test_a_grpo_spec_is_planned_from_its_settings() -> None:
    assert P40 is not None
    spec = grpo_spec(maxLength=512, batchSize=2, grpo={"numGenerations": 6, "beta": 0.1, "numIterations": 2})
    assert terms_of(spec.training) == GrpoTerms(6, 16, 2, 0.1)
    recipe = recipe_from_spec(spec, P40)
    assert (recipe.batch_size, recipe.rows, recipe.reference_forwards) == (12, 2, 1)
    assert recipe.grpo == GrpoTerms(6, 16, 2, 0.1)
    assert terms_of(grpo_spec().training.model_copy(update={"method": "sft"})) is None


def test_the_jobs_steps_are_the_schedules_times_num_iterations() -> None:
    spec = grpo_spec(maxLength=512, maxSteps=None, epochs=2, batchSize=2, gradientAccumulation=3)
    iterated = grpo_spec(
        maxLength=512, maxSteps=None, epochs=2, batchSize=2, gradientAccumulation=3, grpo={"numIterations": 3}
    )
    per_epoch = math.ceil(math.ceil(1000 / 2) / 3)
    assert optimizer_steps(spec, 1000, 1) == 2 * per_epoch
    assert optimizer_steps(iterated, 1000, 1) == 3 * 2 * per_epoch
    assert optimizer_steps(iterated, None, 1) is None
    assert optimizer_steps(grpo_spec(maxSteps=20), None, 1) == 20  # maxSteps counts optimizer steps
    launch = choose(iterated, LLAMA_3_8B, 1, attention="memory_efficient")
    assert launch.plan is not None and launch.plan.grpo is not None
    timed = job_time(launch.plan, iterated, None, records=1000, processes=1)
    assert timed.seconds == pytest.approx(3 * 2 * per_epoch * launch.plan.grpo.step_seconds)
    assert f"{3 * 2 * per_epoch:,} optimizer steps" in timed.how
    assert job_time(launch.plan, iterated, None).seconds is None


def test_the_report_prints_the_grpo_step_and_the_rollouts_phase() -> None:
    plan = planned(grpo_recipe(512, 256, 8))
    text = render(plan)
    (line,) = [x for x in text.splitlines() if x.startswith("grpo ")]
    assert line.startswith(
        "grpo      step: rollouts 8 x 256 tokens per prompt (1 prompt of up to 256 tokens a micro-batch), "
        "KV cache 1.00 GiB; generation "
    )
    assert ", scoring " in line and ", per step " in line
    assert "rollouts (no-grad phase)" in text and "pairs " not in text
    assert plan.to_dict()["grpo"]["kvCacheBytes"] == GIB and plan.summary["grpo"]["numGenerations"] == 8
    sft = planned(Recipe(max_length=512, attention="memory_efficient"))
    assert "grpo " not in render(sft) and "rollouts" not in render(sft) and sft.grpo is None
    assert sft.to_dict()["grpo"] is None and "grpo" not in sft.summary

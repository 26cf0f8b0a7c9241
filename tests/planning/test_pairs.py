"""Preference tuning in the planner: a pair is two sequences through the model, DPO's reference a
forward of each without gradients, and where one micro-batch of both sides does not fit the
planner splits the pair (`finetune_plan.pairs`): the chosen sequences, then the rejected ones, at
the cost of one more forward of each without gradients."""

from dataclasses import replace
from typing import Any

import pytest
import yaml

from finetune_api.spec import FineTuneJobSpec
from finetune_plan import GIB, Plan, choose, lookup, make_plan
from finetune_plan import pairs as pair_split
from finetune_plan.inputs import recipe_from_spec
from finetune_plan.messages.report import render
from finetune_plan.parallelism import AUTO_MODES
from finetune_plan.speed import forward_seconds

from .models import EXAMPLE, LLAMA_3_8B, LLAMA_33_70B

P40 = lookup("Tesla-P40")
assert P40 is not None
FORMATS = {"sft": "alpaca", "dpo": "preference", "orpo": "preference"}


def spec(method: str = "dpo", gpus: int = 4, **training: Any) -> FineTuneJobSpec:
    """The 70B-on-4-P40 example's spec, trained with `method` on its dataset format."""
    body = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))["spec"]
    body["dataset"]["format"] = FORMATS[method]
    body["training"].update({"method": method, **training})
    body["resources"]["gpus"] = gpus
    return FineTuneJobSpec.model_validate(body)


def plan_of(job: FineTuneJobSpec, config: dict[str, Any]) -> Plan:
    """The plan with the trainer's fp32 attention (the fused kernel: no probabilities kept)."""
    launch = choose(job, config, job.resources.gpus, attention="memory_efficient")
    assert launch.plan is not None
    return launch.plan


def test_a_pair_is_two_sequences_and_dpo_alone_has_a_reference_forward() -> None:
    assert P40 is not None
    sft, dpo, orpo = (recipe_from_spec(spec(m), P40) for m in ("sft", "dpo", "orpo"))
    assert (dpo.batch_size, dpo.tokens) == (2 * sft.batch_size, 2 * sft.tokens)
    assert (orpo.batch_size, orpo.tokens) == (2 * sft.batch_size, 2 * sft.tokens)
    assert sft.rows == dpo.rows == orpo.rows == 1  # training.batchSize
    assert (sft.reference_forwards, dpo.reference_forwards, orpo.reference_forwards) == (0, 1, 0)
    assert not dpo.pair_split and pair_split.splittable(dpo) and not pair_split.splittable(sft)


def test_the_reference_forward_makes_dpo_slower_than_orpo_on_the_same_plan() -> None:
    """8B on one P40 at 1024 tokens: both fit unsplit with the same layers kept, so DPO's micro-batch
    is ORPO's plus its reference forwards (the model without its adapter, without gradients)."""
    sft, dpo, orpo = (plan_of(spec(m, gpus=1, maxLength=1024), LLAMA_3_8B) for m in ("sft", "dpo", "orpo"))
    assert dpo.fits and orpo.fits and sft.fits
    assert replace(dpo.recipe, reference_forwards=0) == orpo.recipe  # the same plan but the reference
    assert dpo.speed is not None and orpo.speed is not None and sft.speed is not None
    assert sft.speed.reference_seconds == orpo.speed.reference_seconds == 0.0
    assert dpo.speed.reference_seconds > 0
    assert dpo.speed.step_seconds == pytest.approx(orpo.speed.step_seconds + dpo.speed.reference_seconds)
    assert dpo.speed.tokens_per_second < orpo.speed.tokens_per_second
    # A forward without gradients costs less than a third of a trained pass (forward, recompute
    # of the checkpointed layers, a backward of about two forwards) and more than nothing.
    trained = orpo.speed.step_seconds
    assert 0.15 * trained < dpo.speed.reference_seconds < 0.34 * trained
    assert dpo.summary["reference_forwards"] == 1 and dpo.summary["reference_seconds"] > 0
    assert "reference_seconds" not in orpo.summary and "pair_split" in orpo.summary
    reference = forward_seconds(dpo.shape, dpo.recipe, dpo.hardware.product, adapters=False)
    assert dpo.speed.reference_seconds == pytest.approx(reference)  # one pass of 2 x 1024 tokens
    assert reference < forward_seconds(dpo.shape, dpo.recipe, dpo.hardware.product, adapters=True)


def test_one_sequence_a_row_has_no_pair_and_no_reference_in_the_report() -> None:
    sft = plan_of(spec("sft", gpus=1, maxLength=1024), LLAMA_3_8B)
    text = render(sft)
    assert "pairs " not in text and "reference " not in text
    assert "pair_split" not in sft.summary and sft.to_dict()["pairs"] is None


def test_a_70b_on_four_p40s_splits_the_pair_only_where_one_micro_batch_of_both_does_not_fit() -> None:
    """At 4096 tokens one forward of chosen and rejected (8192 tokens) does not fit 4 P40s,
    even with every layer recomputing and their inputs in host memory; one side at a time does.
    At 2048 both sides fit in one micro-batch: no split. SFT at 4096 needs no split either."""
    short, long = (plan_of(spec("dpo", maxLength=n), LLAMA_33_70B) for n in (2048, 4096))
    assert short.fits and not short.recipe.pair_split and short.unsplit is None
    assert short.recipe.batch_size == 2  # 2 x 1 sequences in one pass

    assert long.fits and long.recipe.pair_split
    assert (long.recipe.batch_size, long.recipe.rows, long.recipe.grad_passes) == (1, 1, 2)
    assert long.unsplit is not None and not long.unsplit.fits
    # The unsplit micro-batch as the planner tried it, with nothing that could split it.
    whole = make_plan(
        long.shape,
        replace(pair_split.with_rows(replace(long.recipe, pair_split=False), 1), sequence_names=()),
        long.hardware,
        checkpointing=True,
        offload="auto",
        allowed_modes=AUTO_MODES,
    )
    assert not whole.fits and whole.recipe.batch_size == 2
    assert whole.shortfall_gib == pytest.approx(long.unsplit.shortfall / GIB)
    sft = plan_of(spec("sft", maxLength=4096), LLAMA_33_70B)
    assert sft.fits and sft.recipe.batch_size == 1 and not sft.recipe.pair_split

    # The split's price: one more forward of each side with the adapter on, besides the reference.
    speed = long.speed
    assert speed is not None and speed.split_seconds > 0 and speed.reference_seconds > 0
    assert speed.split_seconds > speed.reference_seconds  # the adapter's forward on top
    assert long.summary["pair_split"] is True and long.to_dict()["pairs"] == (
        "chosen and rejected in two micro-batches of 1 sequence each"
    )
    assert "chosen and rejected in two micro-batches of 1 sequence each" in long.message


def test_a_pair_that_no_split_fits_says_what_would() -> None:
    """Two P40s hold no 70B at all: the verdict is the split's (the closest), its suggestions in
    the spec's words (batchSize counts pairs)."""
    plan = plan_of(spec("dpo", gpus=2, maxLength=4096, batchSize=2), LLAMA_33_70B)
    assert not plan.fits and plan.recipe.pair_split and plan.recipe.rows == 2
    assert any("fits on" in s and "x Tesla-P40" in s for s in plan.suggestions)


def test_the_report_says_how_pairs_go_through_and_what_the_reference_costs() -> None:
    short, long = (plan_of(spec("dpo", maxLength=n), LLAMA_33_70B) for n in (2048, 4096))
    assert short.speed is not None and long.speed is not None
    text = render(short)
    assert "maxLength 2048 x batch 1," in text
    assert "pairs     chosen and rejected in one micro-batch of 2 x 1 sequences\n" in text
    assert (
        f"reference 1 no-grad forward per sequence (the model without its adapter): "
        f"{short.speed.reference_seconds:.2f} s of {short.speed.step_seconds:.2f} s per micro-batch"
    ) in text
    text = render(long)
    assert "pairs     chosen and rejected in two micro-batches of 1 sequence each (memory: one of 2 x 1 " in text
    assert f"each side first once without gradients: {long.speed.split_seconds:.2f} s" in text
    assert "reference 1 no-grad forward per sequence" in text
    orpo = render(plan_of(spec("orpo", maxLength=2048), LLAMA_33_70B))
    assert "pairs     chosen and rejected in one micro-batch" in orpo and "reference " not in orpo

"""What a spec may decide that the planner would: the layers that keep their activations
(`training.keptLayers`), the recomputing layers' inputs in host memory (`activationOffload:
inputs`) and a preference pair's split (`training.pairSplit`). The plan obeys each, or refuses it
in one line naming the field; it never leaves one aside without a word."""

from typing import Any

from finetune_api.spec import FineTuneJobSpec
from finetune_plan import Plan, choose, memory
from finetune_plan.messages.verdict import PAIRS_UNSPLIT

from .models import LLAMA_3_8B, LLAMA_33_70B
from .test_pairs import plan_of
from .test_pairs import spec as pair_spec


def _spec(**training: Any) -> FineTuneJobSpec:
    return FineTuneJobSpec.model_validate(
        {
            "model": {"source": {"pvc": {"claimName": "m"}}},
            "dataset": {"source": {"pvc": {"claimName": "d", "path": "x.jsonl"}}, "format": "text"},
            "output": {"pvc": {"claimName": "o"}},
            "training": {"maxLength": 2048, **training},
            "resources": {"gpus": 1, "memory": "200Gi"},
        }
    )


def _plan(job: FineTuneJobSpec, gpu_memory_gib: float = 22.4) -> Plan:
    launch = choose(
        job,
        LLAMA_3_8B,
        1,
        gpu_name="Tesla P40",
        attention="memory_efficient",
        gpu_memory_bytes=int(gpu_memory_gib * 2**30),
    )
    assert launch.plan is not None
    return launch.plan


def test_kept_layers_under_what_fits_are_kept() -> None:
    sized = _plan(_spec(activationOffload=False))
    most = sized.recipe.kept_layers
    assert 2 < most < 32, sized.message
    asked = _plan(_spec(activationOffload=False, keptLayers=2))
    assert asked.fits, asked.message
    assert asked.recipe.kept_layers == 2 and memory.recomputed_layers(asked.shape, asked.recipe) == 30
    assert asked.activations is not None and asked.activations.refusal is None
    assert asked.activations.offload == "off (activationOffload: false)"
    # Offload auto: the layers named are kept and the others recompute, said so.
    weighed = _plan(_spec(keptLayers=2))
    assert weighed.fits and weighed.recipe.kept_layers == 2 and not weighed.recipe.offload
    assert weighed.activations is not None
    assert weighed.activations.offload == "off (auto): training.keptLayers names the layers kept"


def test_kept_layers_above_what_fits_are_refused_naming_the_field() -> None:
    most = _plan(_spec(activationOffload=False)).recipe.kept_layers
    refused = _plan(_spec(activationOffload=False, keptLayers=most + 1))
    assert not refused.fits
    assert refused.message.startswith(f"training.keptLayers: {most + 1} layers keeping their activations do not fit")
    assert f"at most {most} fit" in refused.message
    assert refused.suggestions == (refused.message.split(" (the plan: ")[0],)


def test_more_kept_layers_than_the_model_has_keep_them_all() -> None:
    plan = _plan(_spec(activationOffload=False, keptLayers=1000), gpu_memory_gib=80.0)
    assert plan.fits and memory.kept_layers(plan.shape, plan.recipe) == 32, plan.message


def test_offload_inputs_puts_the_recomputing_layers_inputs_in_host_memory_and_offloads_no_layer() -> None:
    plan = _plan(_spec(gradientCheckpointing=True, activationOffload="inputs"), gpu_memory_gib=80.0)
    assert plan.fits, plan.message
    assert memory.inputs_offloaded(plan.recipe) and memory.offloaded_layers(plan.shape, plan.recipe) == 0
    assert memory.recomputed_layers(plan.shape, plan.recipe) == 32
    assert plan.layers.inputs_offloaded
    assert plan.activations is not None
    assert plan.activations.offload == "the recomputing layers' inputs only (activationOffload: inputs)"
    plain = _plan(_spec(gradientCheckpointing=True, activationOffload=False), gpu_memory_gib=80.0)
    assert not memory.inputs_offloaded(plain.recipe)


def test_pair_split_true_splits_where_one_pass_fits_and_false_never_splits() -> None:
    together = plan_of(pair_spec("dpo", maxLength=2048), LLAMA_33_70B)
    assert together.fits and not together.recipe.pair_split
    split = plan_of(pair_spec("dpo", maxLength=2048, pairSplit=True), LLAMA_33_70B)
    assert split.fits and split.recipe.pair_split, split.message
    assert "(training.pairSplit: true)" in split.message
    # At 4096 tokens only the split fits (test_pairs.py): false keeps them together and says so.
    unsplit = plan_of(pair_spec("dpo", maxLength=4096, pairSplit=False), LLAMA_33_70B)
    assert not unsplit.fits and not unsplit.recipe.pair_split
    assert PAIRS_UNSPLIT in unsplit.suggestions and "training.pairSplit: false" in unsplit.message

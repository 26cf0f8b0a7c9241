"""Host memory a node has (issue #39): what offload pins is bounded by the pod's host memory, the
spec's `resources.memory` or what a node of the GPU product offers for the pod's GPUs; a pod never
asks for more, and a plan with nothing that fits names the field to change, in one line."""

import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from finetune_api import modes
from finetune_api.spec import FineTuneJobSpec
from finetune_plan import GIB, Hardware, Plan, Recipe, choose, lookup, make_plan, memory, shape_from_config
from finetune_plan.gpu_products import PRODUCTS
from finetune_plan.host.limit import CHART_FIELD, SPEC_FIELD
from finetune_plan.messages.host import need_line
from finetune_plan.pod import memory_refusal

from .models import LLAMA_2_13B, LLAMA_3_8B, LLAMA_33_70B
from .test_parallelism import example_spec

P40 = lookup("Tesla-P40")
assert P40 is not None
ALL_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def job_spec(
    gpus: int = 4, product: str = "Tesla-P40", lora: dict[str, Any] | None = None, **training: Any
) -> FineTuneJobSpec:
    return FineTuneJobSpec.model_validate(
        {
            "model": {"source": {"pvc": {"claimName": "m"}}},
            "dataset": {"source": {"pvc": {"claimName": "d", "path": "x.jsonl"}}, "format": "text"},
            "output": {"pvc": {"claimName": "o"}},
            "lora": lora or {"r": 64, "dropout": 0.05, "targetModules": ALL_LINEARS},
            "training": {"maxLength": 2048, **training},
            "resources": {"gpus": gpus, "gpuProduct": product},
        }
    )


def planned(spec: FineTuneJobSpec, config: dict[str, Any], **kwargs: Any) -> Plan:
    """The launch's plan, whose host figure is for the processes the launch runs."""
    launch = choose(spec, config, spec.resources.gpus, **kwargs)
    assert launch.plan is not None and launch.plan.host.processes == launch.processes
    return launch.plan


def pod_gib(plan: Plan) -> int:
    """What the operator writes as the pod's memory, in GiB."""
    return plan.host.gib


def test_every_product_has_a_host_budget_per_gpu_of_at_least_its_memory() -> None:
    """A budget below the GPU's own memory would starve even a plan that offloads nothing."""
    for _, product in PRODUCTS:
        assert product.host_memory_gib >= product.memory_gib * 0.75, product
    assert P40 is not None and P40.host_memory_gib == 28


@pytest.mark.parametrize("attention", ["memory_efficient", "materialised"])
def test_13b_on_four_p40s_pins_only_what_a_node_offers(attention: str) -> None:
    """Llama-2-13B, r=64 on all seven linears, dropout, 2048 tokens, 4 x P40, no resources.memory:
    offload `auto` pinned 54.7 GiB per process (materialised attention) and asked for a 252Gi pod;
    now it offloads fewer layers, the first ones recompute, and the pod fits 4 x 28 GiB."""
    assert P40 is not None
    plan = planned(job_spec(), LLAMA_2_13B, attention=attention)
    assert plan.fits, plan.message
    assert pod_gib(plan) <= 4 * P40.host_memory_gib
    asked = replace(plan.recipe, max_offloaded=None)
    unbounded = make_plan(plan.shape, asked, plan.hardware, checkpointing="auto", offload="auto")
    assert pod_gib(unbounded) > 4 * P40.host_memory_gib  # the figure, without the limit
    offloaded = memory.offloaded_layers(plan.shape, plan.recipe)
    assert 0 < offloaded < memory.offloaded_layers(unbounded.shape, unbounded.recipe)
    assert plan.activations is not None and f"{offloaded} layers: what fits the 112 GiB" in plan.activations.offload
    # Still faster than recomputing every layer not kept.
    assert plan.speed is not None and plan.activations.all_recompute_tokens_per_second is not None
    assert plan.speed.tokens_per_second > plan.activations.all_recompute_tokens_per_second


def test_the_headline_70b_example_still_fits_with_its_margin_and_a_48gi_pod() -> None:
    """70B on 4 x P40 at 2048 tokens: fsdp, the 80 recomputing layers' inputs in host memory, 4.1
    GiB to spare per GPU, 48Gi for the pod: well inside 4 x 28 GiB."""
    plan = planned(example_spec(), LLAMA_33_70B, attention="memory_efficient")
    assert plan.fits and plan.parallelism == "fsdp", plan.message
    assert plan.summary["inputs_offloaded"] and plan.layout.fullest.headroom >= 4.1 * GIB
    assert plan.host.quantity == "48Gi"
    assert plan.host_limit is not None and plan.host_limit.limit == 112 * GIB


def test_the_charts_figure_replaces_the_products_default() -> None:
    roomy = planned(job_spec(), LLAMA_2_13B, host_memory_per_gpu=96 * GIB)
    default = planned(job_spec(), LLAMA_2_13B)
    assert pod_gib(roomy) > pod_gib(default)
    assert memory.offloaded_layers(roomy.shape, roomy.recipe) > memory.offloaded_layers(default.shape, default.recipe)
    assert roomy.host_limit is not None and f"4 x 96 GiB, {CHART_FIELD}" == roomy.host_limit.detail


def test_the_pods_own_limit_in_the_pod_plans_what_the_operator_planned() -> None:
    """The trainer plans against its container's limit, the operator's figure: the same plan."""
    operator = planned(job_spec(), LLAMA_2_13B)
    limit = pod_gib(operator) * GIB
    trainer = planned(job_spec(), LLAMA_2_13B, host_memory=limit)
    assert trainer.recipe == operator.recipe and trainer.mode == operator.mode


def _one_line(text: str) -> None:
    assert "\n" not in text and "Traceback" not in text


def test_offload_true_above_the_node_says_to_set_auto_or_raise_the_memory() -> None:
    plan = planned(job_spec(activationOffload=True, gradientCheckpointing=True), LLAMA_2_13B)
    assert not plan.fits and plan.host_refusal is not None
    _one_line(plan.message)
    assert plan.message.startswith("does not fit the host memory: the pod needs")
    assert "set training.activationOffload: auto" in plan.message and SPEC_FIELD in plan.message
    host = plan.host
    assert memory_refusal(job_spec(activationOffload=True, gradientCheckpointing=True), host) == plan.host_refusal


def test_a_node_too_small_for_the_trainers_themselves_names_the_memory_fields() -> None:
    plan = planned(job_spec(), LLAMA_2_13B, host_memory_per_gpu=2 * GIB)
    assert not plan.fits and plan.host_refusal is not None
    _one_line(plan.message)
    assert SPEC_FIELD in plan.message and CHART_FIELD in plan.message
    assert plan.summary["offloaded_layers"] == 0  # not one layer fits: offload stays off


def test_inputs_the_gpus_need_in_host_memory_above_the_node_say_maxlength_or_memory() -> None:
    """The headline job at 2048 tokens fits the GPUs only with its 80 inputs in host memory (48Gi):
    a node offering 4 x 10 GiB cannot hold them, and the plan says what to change."""
    plan = planned(example_spec(), LLAMA_33_70B, attention="memory_efficient", host_memory_per_gpu=10 * GIB)
    assert not plan.fits
    _one_line(plan.message)
    assert "the recomputing layers' inputs in host memory would fit the GPUs, but take the pod to" in plan.message
    assert SPEC_FIELD in plan.message and "lower training.maxLength" in plan.message


# --- the grid: no plan asks more than its limit ----------------------------------------------

FAMILIES: dict[str, dict[str, Any]] = {
    "llama-2-13b": LLAMA_2_13B,
    "llama-3-8b": LLAMA_3_8B,
    "llama-3.3-70b": LLAMA_33_70B,
    "llama-3.2-1b": {
        **LLAMA_3_8B,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "tie_word_embeddings": True,
    },
    "qwen2-7b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    },
}
PRODUCT_NAMES = ("Tesla-P40", "Tesla-P100-PCIE-16GB", "Tesla-V100-32GB", "NVIDIA-A100-40GB", "NVIDIA-H100-PCIe")


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    product=st.sampled_from(PRODUCT_NAMES),
    gpus=st.sampled_from([1, 2, 4, 8]),
    parallelism=st.sampled_from(modes.SPEC_WORDS),
    max_length=st.sampled_from([512, 1024, 2048, 4096, 8192]),
    r=st.sampled_from([8, 16, 64]),
    targets=st.sampled_from([["q_proj", "v_proj"], ["q_proj", "k_proj", "v_proj", "o_proj"], ALL_LINEARS]),
    dropout=st.sampled_from([0.0, 0.05]),
    checkpointing=st.sampled_from([True, "auto"]),
    offload=st.sampled_from([True, False, "auto"]),
    per_gpu=st.sampled_from([None, 8, 16, 48]),
    memory=st.sampled_from([None, None, "24Gi", "96Gi"]),
)
def test_no_plan_asks_more_host_memory_than_its_limit(
    family: str,
    product: str,
    gpus: int,
    parallelism: str,
    max_length: int,
    r: int,
    targets: list[str],
    dropout: float,
    checkpointing: bool | str,
    offload: bool | str,
    per_gpu: int | None,
    memory: str | None,
) -> None:
    """Whatever the shape, GPUs, mode, length and LoRA: a pod the operator would make (the plan fits
    and no refusal) asks at most its limit, whole GiB as written; a plan refused for host memory
    says so in one line naming `resources.memory`."""
    spec = job_spec(
        gpus,
        product,
        {"r": r, "dropout": dropout, "targetModules": targets},
        maxLength=max_length,
        parallelism=parallelism,
        gradientCheckpointing=checkpointing,
        activationOffload=offload,
    )
    if memory is not None:
        spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"memory": memory})})
    plan = planned(
        spec,
        FAMILIES[family],
        attention="memory_efficient",
        host_memory_per_gpu=None if per_gpu is None else per_gpu * GIB,
    )
    limit = plan.host_limit
    assert limit is not None
    host = plan.host
    refusal = memory_refusal(spec, host)
    if plan.fits and refusal is None:
        assert host.gib * GIB <= limit.limit, (plan.message, need_line(host))
        assert math.ceil(host.pod_bytes / GIB) == host.gib
    if refusal is not None:
        _one_line(refusal)
        assert SPEC_FIELD in refusal
    if plan.host_refusal is not None:
        assert not plan.fits and plan.message.startswith("does not fit the host memory")


def test_an_unbounded_planner_call_is_the_planners_own() -> None:
    """make_plan without a limit (the planner's own tests, the benchmarks) pins what pays."""
    assert P40 is not None
    shape = shape_from_config(LLAMA_2_13B)
    recipe = Recipe(max_length=2048, lora_r=64, lora_targets=tuple(ALL_LINEARS), attention="memory_efficient")
    plan = make_plan(shape, recipe, Hardware(4, P40, P40.memory_gib), checkpointing="auto", offload="auto")
    assert plan.host_limit is None and plan.host_refusal is None
    assert memory.recomputed_layers(shape, plan.recipe) == 0

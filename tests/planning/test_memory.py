"""The memory model's parts against arithmetic done by hand (and the project brief's figures)."""

from dataclasses import replace

import pytest

from finetune_plan import GIB, Hardware, Recipe, lookup, make_plan, shape_from_config
from finetune_plan import memory as mem
from finetune_plan.host.pinned import offload_host_bytes, pinned_block, pinned_layer_bytes
from finetune_plan.model_shape import ModelConfigError

from .models import LLAMA_2_13B, LLAMA_3_8B, LLAMA_33_70B

SHAPE_70B = shape_from_config(LLAMA_33_70B)
P40 = lookup("Tesla-P40")
assert P40 is not None


def test_70b_parameter_count():
    assert SHAPE_70B.total_params / 1e9 == pytest.approx(70.6, abs=0.1)


def test_nf4_double_quant_weights_of_70b_are_about_35_gb():
    recipe = Recipe()
    assert mem.quantised_bytes_per_param(recipe) == pytest.approx(0.5 + 1 / 64 + 4 / (64 * 256))
    assert SHAPE_70B.layers * mem.layer_weight_bytes(SHAPE_70B, recipe) / 1e9 == pytest.approx(35.3, abs=0.1)
    single = replace(recipe, double_quant=False)
    assert mem.quantised_bytes_per_param(single) == pytest.approx(0.5625)


def test_fp32_embeddings_and_head_of_70b_are_8_4_gb():
    both = mem.embedding_bytes(SHAPE_70B, Recipe()) + mem.head_bytes(SHAPE_70B)
    assert both / 1e9 == pytest.approx(8.4, abs=0.05)


def test_checkpointed_layer_inputs_of_70b_at_2048_are_5_4_gb():
    total = SHAPE_70B.layers * mem.checkpoint_bytes_per_layer(SHAPE_70B, Recipe(max_length=2048))
    assert total / 1e9 == pytest.approx(5.4, abs=0.05)


def test_lora_state_of_70b_is_about_0_3_gb():
    total = SHAPE_70B.layers * mem.lora_state_bytes_per_layer(SHAPE_70B, Recipe())
    assert 0.25 < total / 1e9 < 0.4
    adam32 = SHAPE_70B.layers * mem.lora_state_bytes_per_layer(SHAPE_70B, Recipe(optimizer="paged_adamw_32bit"))
    assert adam32 > total


def test_full_sequence_logits_are_three_fp32_copies_and_chunks_are_smaller():
    full = mem.logits_bytes(SHAPE_70B, Recipe(max_length=2048))
    assert full == pytest.approx(3 * 2048 * 128256 * 4)
    assert mem.logits_bytes(SHAPE_70B, Recipe(max_length=2048, loss_chunk_tokens=256)) < full / 4


@pytest.mark.parametrize("mode", ["device_map", "fsdp", "data_parallel"])
def test_memory_grows_with_sequence_length_and_without_checkpointing(mode: str):
    shape = shape_from_config(LLAMA_3_8B)
    hw = Hardware(2, P40, 1000.0)  # room enough that every variant is laid out the same way

    def peak(recipe: Recipe) -> float:
        return max(g.total for g in make_plan(shape, recipe, hw, mode=mode, loss_chunks=[0]).per_gpu)

    assert peak(Recipe(max_length=1024)) < peak(Recipe(max_length=2048)) < peak(Recipe(max_length=4096))
    assert peak(Recipe(gradient_checkpointing=True)) < peak(Recipe(gradient_checkpointing=False))
    assert peak(Recipe(batch_size=1)) < peak(Recipe(batch_size=2))


def test_fsdp_shards_weights_over_more_gpus():
    recipe = Recipe()
    two = make_plan(SHAPE_70B, recipe, Hardware(2, P40, 1000.0), mode="fsdp").per_gpu[0]
    eight = make_plan(SHAPE_70B, recipe, Hardware(8, P40, 1000.0), mode="fsdp").per_gpu[0]
    # The packed 4-bit bytes are sharded; the quantisation state (not a parameter) is not.
    state = SHAPE_70B.layers * SHAPE_70B.linear_params_per_layer * mem.quant_constant_bytes_per_param(recipe)
    assert eight.quantised_weights - state == pytest.approx((two.quantised_weights - state) / 4)
    assert eight.embeddings_head == pytest.approx(two.embeddings_head / 4)
    # The adapter stays whole on every rank (outside FSDP), so its state does not shrink.
    assert eight.lora_optimizer == two.lora_optimizer
    assert eight.activations == two.activations  # every GPU runs whole sequences


def test_gpu_memory_override_decides_fit():
    shape = shape_from_config(LLAMA_3_8B)
    assert make_plan(shape, Recipe(), Hardware(1, P40, 22.4)).fits
    assert not make_plan(shape, Recipe(), Hardware(1, P40, 8.0)).fits


def test_the_last_gpu_of_70b_in_device_map_against_hand_arithmetic():
    """Hand arithmetic for the parts of the last of 4 P40s in deviceMap at 2048 tokens (the layer
    count it holds is the planner's): a 70B layer has 855,638,016 NF4 parameters at 0.5 + 1/64 +
    4/(64 x 256) bytes; the fp32 head is 128256 x 8192 x 4 bytes; the whole-sequence loss keeps
    three fp32 copies of 2048 x 128256 logits; LoRA r=8 on q/k/v/o is 409,600 parameters a layer
    at 4 (weight) + 4 (gradient) + 2 (8-bit Adam's two states) bytes. The total is then the rule
    `ftjob plan` prints (resident + the larger pass + context), from those hand figures plus the
    planner's own activations, temporaries and context. Against a measurement: test_calibration.py
    and the layer test below."""
    gpu = make_plan(SHAPE_70B, Recipe(), Hardware(4, P40, 22.4), mode="device_map").per_gpu[3]
    layer = 855_638_016 * (0.5 + 1 / 64 + 4 / (64 * 256))
    assert gpu.quantised_weights == pytest.approx(gpu.layers * layer)
    assert gpu.embeddings_head == 128256 * 8192 * 4
    assert gpu.logits == 3 * 2048 * 128256 * 4
    assert gpu.lora_optimizer == pytest.approx(gpu.layers * 409_600 * 10, rel=0.01)
    resident = gpu.layers * layer + 128256 * 8192 * 4 + gpu.norms + gpu.layers * 409_600 * 10 + gpu.activations
    total = resident + max(gpu.temporaries, 3 * 2048 * 128256 * 4) + gpu.overhead
    assert gpu.total == pytest.approx(total, rel=0.001)
    assert gpu.headroom == pytest.approx(22.4 * GIB - gpu.total)


def test_a_70b_layers_weights_against_the_committed_measurement():
    """Committed measurement: bench/results/2026-11-30-h200-layer-memory.json, one 70B-shaped
    layer loaded NF4 with double quant and LoRA r=8 on q/k/v/o on the H200 (allocator
    statistics). The planner's layer weights plus its LoRA weights within 1% of it."""
    import json
    from pathlib import Path

    record = json.loads(
        (Path(__file__).resolve().parents[2] / "bench" / "results" / "2026-11-30-h200-layer-memory.json").read_text()
    )
    planned = mem.layer_weight_bytes(SHAPE_70B, Recipe()) + record["lora_bytes_per_layer"]
    assert planned == pytest.approx(record["layer_weights_bytes"], rel=0.01)
    assert mem.head_bytes(SHAPE_70B) == record["lm_head_bytes"]
    assert mem.embedding_bytes(SHAPE_70B, Recipe()) == record["embed_bytes"]


def test_known_products_are_found_by_label_and_by_torch_name():
    for name, gib in [
        ("Tesla-P40", 22.4),
        ("Tesla P40", 22.4),
        ("Tesla-P100-PCIE-16GB", 15.9),
        ("Tesla-V100-SXM2-32GB", 31.7),
        ("NVIDIA-A100-SXM4-40GB", 39.4),
        ("NVIDIA A100-SXM4-80GB", 79.2),
        ("NVIDIA-H100-80GB-HBM3", 79.2),
        ("NVIDIA H200", 139.8),
    ]:
        product = lookup(name)
        assert product is not None, name
        assert product.memory_gib == gib, name
    assert lookup("Radeon-9700") is None


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({}, "hidden_size"),
        ({"hidden_size": 64}, "num_attention_heads"),
        ({"hidden_size": 64, "num_attention_heads": 4}, "num_hidden_layers"),
    ],
)
def test_incomplete_config_names_the_missing_key(config: dict[str, int], key: str):
    with pytest.raises(ModelConfigError, match=key):
        shape_from_config(config)


def test_tied_embeddings_keep_one_matrix_and_the_loss_on_gpu_0():
    tied = shape_from_config({**LLAMA_3_8B, "tie_word_embeddings": True})
    assert mem.head_bytes(tied) == 0
    plan = make_plan(tied, Recipe(), Hardware(2, P40, 22.4), mode="device_map")
    assert plan.per_gpu[0].logits > 0 and plan.per_gpu[1].logits == 0


def test_the_whole_load_figure_is_within_15_percent_of_the_measured_anonymous_peak() -> None:
    """Committed measurement: the 40-layer fsdp bench record (2 GPUs, the loader before streaming,
    which fsdp still uses for a checkpoint without safetensors) against that figure."""
    import json
    from pathlib import Path

    record = json.loads((Path(__file__).parents[2] / "bench/results/2026-11-30-h200-2gpu-40l-fsdp.json").read_text())
    measured = record["ours"]["peakHostAnonGiBPerProcess"]
    shape = shape_from_config({**LLAMA_33_70B, "num_hidden_layers": record["shape"]["layers"]})
    plan = make_plan(shape, Recipe(max_length=record["seq"]), Hardware(2, P40, 22.4), mode="fsdp")
    whole = plan.whole_load_host_gib_per_process
    assert whole is not None
    for peak in measured:
        assert abs(whole - peak) / peak < 0.15, (whole, peak)


def test_the_host_figure_covers_the_streamed_and_the_from_pretrained_measurements() -> None:
    """Committed measurement: the 16-layer streamed record. fsdp's streamed loader and the
    one-process from_pretrained load both stay under the planned figure, which is at most the
    issue's bound over them (the largest tensor in fp32 plus 2 GiB)."""
    import json
    from pathlib import Path

    path = Path(__file__).parents[2] / "bench/results/2026-12-01-h200-1gpu-16l-streamed.json"
    record = json.loads(path.read_text())
    shape = shape_from_config({**LLAMA_33_70B, "num_hidden_layers": record["shape"]["layers"]})
    planned = make_plan(shape, Recipe(max_length=record["seq"]), Hardware(2, P40, 22.4), mode="fsdp")
    figure = planned.host_gib_per_process
    bound = 128256 * 8192 * 4 / 2**30 + 2  # the embedding in fp32, 3.91 GiB, plus 2 GiB
    streamed = [r["streamedAnonPeakGiB"] for r in record["streamed_loader"]["ranks"]]
    measured = [*streamed, *record["ours"]["peakHostAnonGiBPerProcess"]]
    assert all(peak <= figure <= bound for peak in measured), (figure, measured)


def test_every_loader_stages_at_most_the_largest_tensor() -> None:
    """Hand arithmetic: for Llama-3-8B the embedding, 128256 x 4096 x 4 bytes = 1.957 GiB, plus
    the 1.5 GiB process base, whatever the mode. fsdp's whole load (no safetensors) is the packed
    model: 32 layers x 218,103,808 linear weights x (0.5 + 1/64 + 4/16384) bytes of NF4 with double
    quantisation = 3.35 GiB, the fp32 embedding and head 3.91 GiB, plus the base: 8.77 GiB."""
    shape = shape_from_config(LLAMA_3_8B)
    one = make_plan(shape, Recipe(), Hardware(1, P40, 22.4)).host_gib_per_process
    replicated = make_plan(shape, Recipe(), Hardware(2, P40, 22.4), mode="data_parallel").host_gib_per_process
    sharded = make_plan(shape, Recipe(), Hardware(2, P40, 22.4), mode="fsdp")
    assert one == replicated == sharded.host_gib_per_process == pytest.approx(128256 * 4096 * 4 / 2**30 + 1.5)
    whole = sharded.whole_load_host_gib_per_process
    layers = 32 * 218_103_808 * (0.5 + 1 / 64 + 4 / 16384) / 2**30
    assert whole == pytest.approx(layers + 2 * 128256 * 4096 * 4 / 2**30 + 1.5, abs=0.01)


def test_the_pods_host_figure_adds_the_stated_margin() -> None:
    """3 processes of 10 GiB: 30 x 1.10 + 2 = 35.0 GiB, written 35Gi; 34 GiB is refused."""
    from finetune_plan.host.need import HostNeed
    from finetune_plan.messages.host import shortfall

    need = HostNeed(10 * 2**30, 3, "fsdp")
    assert need.pod_bytes == pytest.approx(35.0 * 2**30) and need.quantity == "35Gi"
    assert shortfall(need, 35 * 2**30) is None
    message = shortfall(need, 34 * 2**30)
    assert message is not None and "spec.resources.memory 34.0 GiB" in message and "35Gi" in message


GEMMA_2_9B = {
    "model_type": "gemma2",
    "architectures": ["Gemma2ForCausalLM"],
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "num_hidden_layers": 42,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "vocab_size": 256000,
    "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0,
    "tie_word_embeddings": True,
}


def test_soft_capping_keeps_one_more_block_of_logits_and_of_each_attention_matrix() -> None:
    """Hand arithmetic: tanh's saved output is one block of 2048 x 256000 fp32 logits (1.953 GiB)
    and, under eager attention, one 16 x 2048 x 2048 fp32 matrix (0.25 GiB) per layer pass."""
    capped = shape_from_config(GEMMA_2_9B)
    plain = shape_from_config({**GEMMA_2_9B, "final_logit_softcapping": None, "attn_logit_softcapping": None})
    assert capped.logit_softcap and capped.attention_softcap
    assert not plain.logit_softcap and not plain.attention_softcap
    recipe = Recipe(max_length=2048)
    block = 2048 * 256000 * 4
    assert mem.logits_bytes(capped, recipe) - mem.logits_bytes(plain, recipe) == pytest.approx(block)
    assert block / GIB == pytest.approx(1.953, abs=0.001)
    matrix = 16 * 2048 * 2048 * 4
    assert mem.attention_matrix_bytes(capped, recipe) == matrix
    grown = mem.full_layer_activation_bytes(capped, recipe) - mem.full_layer_activation_bytes(plain, recipe)
    assert grown == pytest.approx(matrix)


SHAPE_8B = shape_from_config(LLAMA_3_8B)


def test_a_layer_keeps_the_counted_tensors_and_the_adapters_inputs_once_per_shared_input() -> None:
    """By hand for the 8B shape at 2048 tokens, adapters on q/k/v/o without dropout: 2 hidden-wide
    tensors, 3 attention-wide (4096 for Llama), 3 intermediate-wide, plus the two inputs the
    adapters share (the normed input of q/k/v, the attention output of o), plus one 32 x 2048 x
    2048 matrix: 1.047 GiB, the probe's 1.047 (bench/results/2026-12-02-h200-parts.json)."""
    h, i, t = 4096, 14336, 2048
    recipe = Recipe(max_length=t, lora_dropout=False)
    by_hand = t * 4 * (2 * h + 3 * h + 3 * i + 2 * h) + 32 * t * t * 4
    assert mem.full_layer_activation_bytes(SHAPE_8B, recipe) == by_hand
    assert round(by_hand / GIB, 3) == 1.047
    # Adapting the MLP too keeps its inputs: the normed input gate and up share, and down's.
    every = replace(recipe, lora_targets=(*recipe.lora_targets, "gate_proj", "up_proj", "down_proj"))
    assert mem.full_layer_activation_bytes(SHAPE_8B, every) - by_hand == t * 4 * (h + i)
    # With dropout each adapter keeps its own dropped copy and mask (1.25 floats), the shared
    # inputs no longer: q/k/v/o read 4 x 4096 floats, 2 x 4096 shared before.
    dropped = replace(recipe, lora_dropout=True)
    assert mem.full_layer_activation_bytes(SHAPE_8B, dropped) - by_hand == t * 4 * (1.25 * 4 * h - 2 * h)


def test_a_batchs_loss_chunk_is_of_positions_flattened() -> None:
    """The loss head chunks the micro-batch's positions, rows one after the other: 4 x 512 tokens
    in chunks of 512 holds one chunk of logits, not the whole batch's."""
    batch = Recipe(max_length=512, batch_size=4, loss_chunk_tokens=512)
    whole = replace(batch, loss_chunk_tokens=0)
    vocab = SHAPE_8B.vocab
    assert mem.logits_bytes(SHAPE_8B, whole) == 3 * 4 * 512 * vocab * 4
    assert mem.logits_bytes(SHAPE_8B, batch) == 3 * 512 * vocab * 4 + 4 * 512 * SHAPE_8B.hidden * 4


def test_offloaded_layers_crossing_are_covered_by_the_kept_ones() -> None:
    """At most two offloaded layers are on the GPU at once; kept layers, freed first in the
    backward, give back room for as many of them."""
    recipe = Recipe(max_length=2048, kept_layers=3, offload=True)
    full = mem.full_layer_activation_bytes(SHAPE_8B, recipe)
    assert mem.activations_on_gpu(SHAPE_8B, recipe, 32, 3) == 3 * full
    assert mem.activations_on_gpu(SHAPE_8B, recipe, 32, 1) == 2 * full
    assert mem.activations_on_gpu(SHAPE_8B, recipe, 32, 0) == 2 * full


def test_offloading_some_layers_recomputes_the_first_ones() -> None:
    """Where the pod's host memory holds only some layers' activations (`max_offloaded`), those
    just before the kept ones offload and the first ones recompute: each keeps its input on the
    GPU, and a GPU keeping and offloading none pays for one layer's recompute."""
    recipe = Recipe(max_length=2048, kept_layers=3, offload=True, max_offloaded=10)
    full = mem.full_layer_activation_bytes(SHAPE_8B, recipe)
    checkpoint = mem.checkpoint_bytes_per_layer(SHAPE_8B, recipe)
    assert (mem.kept_layers(SHAPE_8B, recipe), mem.offloaded_layers(SHAPE_8B, recipe)) == (3, 10)
    assert mem.recomputed_layers(SHAPE_8B, recipe) == 19
    assert offload_host_bytes(SHAPE_8B, recipe) == 10 * pinned_layer_bytes(SHAPE_8B, recipe)
    assert mem.activations_on_gpu(SHAPE_8B, recipe, 32, 3) == 3 * full + 19 * checkpoint
    # Layers 19-28 offload: a GPU holding 16-23 has 5 of them, 3 recomputing, none kept.
    assert mem.offloaded_on_gpu(SHAPE_8B, recipe, 16, 8) == 5
    assert mem.kept_on_gpu(SHAPE_8B, recipe, 16, 8) == 0
    assert mem.activations_on_gpu(SHAPE_8B, recipe, 8, 0, 5) == 2 * full + 3 * checkpoint
    one_pass = mem.layer_pass_temporaries(SHAPE_8B, recipe, 8, 0, 5)
    assert mem.layer_pass_temporaries(SHAPE_8B, recipe, 8, 0, 0) == pytest.approx(one_pass + full)
    # Uncapped, every layer not kept offloads, as before.
    every = replace(recipe, max_offloaded=None)
    assert mem.offloaded_layers(SHAPE_8B, every) == 29 and mem.recomputed_layers(SHAPE_8B, every) == 0


def test_pinned_memory_is_counted_per_storage_as_the_allocator_rounds_it() -> None:
    """PyTorch's pinned host allocator hands out powers of two: the storages one layer saves sum to
    `full_layer_activation_bytes`, and each is pinned as the next power of two. A 13B-shaped
    layer at 1024 x 4 tokens (hidden-wide storages of 80 MiB) pins 2.75 GiB for its 1.95 saved."""
    shape = shape_from_config(LLAMA_2_13B)
    recipe = Recipe(
        max_length=1024,
        batch_size=4,
        lora_r=64,
        lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        attention="memory_efficient",
        offload=True,
    )
    storages = mem.saved_storages(shape, recipe)
    assert sum(storages) == pytest.approx(mem.full_layer_activation_bytes(shape, recipe))
    assert pinned_block(80 * 2**20) == 128 * 2**20 and pinned_block(64 * 2**20) == 64 * 2**20
    assert pinned_layer_bytes(shape, recipe) == sum(pinned_block(b) for b in storages)
    assert mem.full_layer_activation_bytes(shape, recipe) / GIB == pytest.approx(1.95, abs=0.01)
    assert pinned_layer_bytes(shape, recipe) / GIB == pytest.approx(2.75, abs=0.01)
    # Without dropout the adapters share their inputs and the o adapter keeps the attention output.
    plain = replace(recipe, lora_dropout=False)
    assert sum(mem.saved_storages(shape, plain)) == pytest.approx(mem.full_layer_activation_bytes(shape, plain))

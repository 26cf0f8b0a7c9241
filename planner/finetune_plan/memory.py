"""Bytes, per component, that the recipe keeps on a GPU: pure arithmetic on shapes.

Every function answers for the whole model or one layer; `layouts` assigns them to GPUs
according to the mode. The recipe: frozen NF4 linear weights, embeddings and lm_head
unquantised (lm_head and norms cast to FP32), LoRA adapters in FP32, FP32 compute. What the
host holds is `host`'s, which reads these figures (a layer's saved tensors, a layer's input).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from finetune_api.optimizers import OPTIMIZERS

from . import calibration as cal
from .gpu_products import GpuProduct
from .model_shape import ATTENTION_MODULES, ModelShape

GIB: Final = 2**30
FP32: Final = 4

Quantization = Literal["nf4", "fp4", "none"]
Attention = Literal["materialised", "memory_efficient"]

# bitsandbytes 4-bit: two weights per byte, one absmax per 64 weights (FP32, or with double
# quantisation 8-bit plus one FP32 constant per 256 blocks).
NF4_BLOCK: Final = 64
DOUBLE_QUANT_BLOCK: Final = 256


def optimizer_bytes(name: str) -> float:
    """Optimizer state bytes per trainable parameter: the optimizer registry's figure."""
    return OPTIMIZERS.get(name).state_bytes_per_param


@dataclass(frozen=True)
class GrpoTerms:
    """GRPO's settings that change a step's memory and time (`training.grpo`, named as the API's
    fields): the group of completions per prompt, their longest, the optimizer steps one batch of
    rollouts serves, and the KL's weight (above 0: a reference forward). `grpo` plans them."""

    num_generations: int = 8
    max_completion_length: int = 256
    num_iterations: int = 1
    beta: float = 0.0


@dataclass(frozen=True)
class Recipe:
    """The training settings that change memory or speed."""

    max_length: int = 2048
    batch_size: int = 1
    gradient_accumulation: int = 1  # micro-batches per optimizer step (speed only)
    lora_r: int = 8
    lora_targets: tuple[str, ...] = ATTENTION_MODULES
    lora_dropout: bool = True
    gradient_checkpointing: bool = True
    # With checkpointing on: how many decoder layers (the last ones) keep their activations
    # instead (`training.gradientCheckpointing: auto`); 0 = every layer recomputes.
    kept_layers: int = 0
    # The checkpointed layers' saved activations go to pinned host memory instead of being
    # recomputed (`training.activationOffload`).
    offload: bool = False
    # With offload: at most this many layers offload (those just before the kept ones), the rest
    # recompute, so that the pinned memory fits the pod's host memory; None: every layer not kept.
    max_offloaded: int | None = None
    # The recomputing layers' inputs (all a checkpointed layer keeps) wait in pinned host memory
    # until their recompute (`training.activationOffload` not false, where the GPU needs it).
    offload_inputs: bool = False
    quantization: Quantization = "nf4"
    double_quant: bool = True
    optimizer: str = "paged_adamw_8bit"
    compute_bytes: int = FP32
    attention: Attention = "materialised"
    packing: bool = False  # packed samples: the fused kernel gets a mask (`attention_mask_bytes`)
    loss_chunk_tokens: int = 0  # 0: logits of the whole sequence at once
    # The objective's terms (`finetune_api.objectives.Objective`). A row of its data is
    # `sequences_per_row` sequences (a preference pair: 2); `batch_size` counts the sequences one
    # forward and backward holds: the micro-batch's rows x sequences_per_row, or with `pair_split`
    # (`pairs`: only for an objective that names its sequences) the rows alone, a row's sequences
    # then going through one pass each.
    sequences_per_row: int = 1
    sequence_names: tuple[str, ...] = ()
    pair_split: bool = False
    # Forwards of each sequence without gradients beside the trained one (DPO's reference: 1).
    reference_forwards: int = 0
    # GRPO (`grpo`): a row is a prompt, `sequences_per_row` its group of completions; each step's
    # rollouts and forwards without gradients are planned beside the scored micro-batch. None:
    # another method.
    grpo: GrpoTerms | None = None

    @property
    def tokens(self) -> int:
        """Tokens one forward and backward holds: what memory is planned for."""
        return self.batch_size * self.max_length

    @property
    def head_tokens(self) -> int:
        """Positions the LM head computes logits of in a trained pass: every token, or for GRPO
        only the completions' (the head's per-token log-probabilities skip the prompt's
        positions: finetune_trainer/model/loss_head.py `_per_token`)."""
        if self.grpo is None:
            return self.tokens
        return self.batch_size * min(self.grpo.max_completion_length, self.max_length)

    @property
    def rows(self) -> int:
        """Rows of the objective's data per micro-batch: `training.batchSize`."""
        return self.batch_size if self.pair_split else self.batch_size // self.sequences_per_row

    @property
    def grad_passes(self) -> int:
        """Forwards with gradients (each with its backward) per micro-batch: one, or with the
        pair split one per sequence of a row."""
        return self.sequences_per_row if self.pair_split else 1

    @property
    def micro_tokens(self) -> int:
        """Tokens a micro-batch trains: what speed is counted in."""
        return self.tokens * self.grad_passes


def packed_bytes_per_param(recipe: Recipe) -> float:
    """The weight data itself: two 4-bit weights per byte (the same bytes whether bitsandbytes
    stores them as uint8 or, for FSDP, as float32), or the compute dtype unquantised."""
    return float(recipe.compute_bytes) if recipe.quantization == "none" else 0.5


def quant_constant_bytes_per_param(recipe: Recipe) -> float:
    """The quantisation state (absmax, nested absmax): kept on the module, not a parameter."""
    if recipe.quantization == "none":
        return 0.0
    return (1 + FP32 / DOUBLE_QUANT_BLOCK) / NF4_BLOCK if recipe.double_quant else FP32 / NF4_BLOCK


def quantised_bytes_per_param(recipe: Recipe) -> float:
    return packed_bytes_per_param(recipe) + quant_constant_bytes_per_param(recipe)


def layer_weight_bytes(shape: ModelShape, recipe: Recipe) -> float:
    return shape.linear_params_per_layer * quantised_bytes_per_param(recipe)


def layer_packed_bytes(shape: ModelShape, recipe: Recipe) -> float:
    """What FSDP shards and gathers of one layer's linears (the quantisation state stays whole)."""
    return shape.linear_params_per_layer * packed_bytes_per_param(recipe)


def embedding_bytes(shape: ModelShape, recipe: Recipe) -> float:
    return shape.embedding_params * recipe.compute_bytes


def head_bytes(shape: ModelShape) -> float:
    """lm_head in FP32; a tied head shares the embedding (one copy, counted there)."""
    return shape.head_params * FP32


def norm_bytes_per_layer(shape: ModelShape) -> float:
    return 2 * shape.hidden * FP32


def lora_state_bytes_per_layer(shape: ModelShape, recipe: Recipe) -> float:
    """Adapter weights and gradients in FP32 plus optimizer state."""
    params = shape.lora_params_per_layer(recipe.lora_r, recipe.lora_targets)
    return params * (2 * FP32 + optimizer_bytes(recipe.optimizer))


def checkpoint_bytes_per_layer(shape: ModelShape, recipe: Recipe) -> float:
    """With gradient checkpointing a layer keeps only its input."""
    return recipe.tokens * shape.hidden * recipe.compute_bytes


def keeps_attention_matrix(recipe: Recipe) -> bool:
    """Whether the attention kernel keeps the heads x seq x seq probabilities: eager attention and
    fp32 SDPA's math kernel ("materialised") do; the fused kernels ("memory_efficient": the
    trainer's expanded-head kernel in fp32, flash in 16-bit) do not."""
    return recipe.attention == "materialised"


def attention_mask_bytes(recipe: Recipe) -> float:
    """The fused kernel's additive mask, built once per forward where the batch has one (padded
    rows of a batch, packed samples): batch x seq x seq floats, rows padded to 16 elements
    (`finetune_trainer.model.attention.aligned_mask`). A batch of one unpacked row has none."""
    if keeps_attention_matrix(recipe) or not (recipe.batch_size > 1 or recipe.packing):
        return 0.0
    aligned = -(-recipe.max_length // 16) * 16
    return float(recipe.batch_size * recipe.max_length * aligned * FP32)


def attention_matrix_bytes(shape: ModelShape, recipe: Recipe) -> float:
    if not keeps_attention_matrix(recipe):
        return 0.0
    return recipe.batch_size * shape.heads * recipe.max_length**2 * recipe.compute_bytes


# The linears that read one tensor. Without dropout their adapters keep that tensor once between
# them (the NF4 base layer keeps no input: it has no weight gradient); with dropout each adapter
# keeps its own dropped copy and mask instead.
INPUT_GROUPS: Final = (
    ("q_proj", "k_proj", "v_proj", "qkv_proj"),
    ("o_proj",),
    ("gate_proj", "up_proj", "gate_up_proj"),
    ("down_proj",),
)


def full_layer_activation_bytes(shape: ModelShape, recipe: Recipe) -> float:
    """Everything one layer keeps for backward when it is not checkpointed: its own tensors
    (calibration.py lists them), the adapters' inputs, and the attention probabilities, counted
    storage by storage (`saved_storages`)."""
    return sum(saved_storages(shape, recipe))


def outside_layers_activation_bytes(shape: ModelShape, recipe: Recipe) -> float:
    """What the GPU holding the loss keeps besides the layers' own: the last layer's output and the
    final norm's, handed to the loss (measured: bench/results/2026-12-02-h200-parts.json)."""
    return cal.ACTIVATION_OUTSIDE_LAYERS_HIDDEN * recipe.tokens * shape.hidden * recipe.compute_bytes


def kept_layers(shape: ModelShape, recipe: Recipe) -> int:
    """Decoder layers that keep their activations on the GPU through the backward."""
    return min(recipe.kept_layers, shape.layers) if recipe.gradient_checkpointing else shape.layers


def offloaded_layers(shape: ModelShape, recipe: Recipe) -> int:
    """Layers whose saved activations wait in host memory for the backward."""
    return _offloaded_of(recipe, shape.layers - kept_layers(shape, recipe))


def recomputed_layers(shape: ModelShape, recipe: Recipe) -> int:
    """Layers whose forward runs again in the backward."""
    return shape.layers - kept_layers(shape, recipe) - offloaded_layers(shape, recipe)


def kept_on_gpu(shape: ModelShape, recipe: Recipe, first: int, layers: int) -> int:
    """Of the `layers` layers from index `first` on one GPU, those that keep their activations:
    the trainer keeps the model's last ones (`kept_layers`)."""
    kept_from = shape.layers - kept_layers(shape, recipe)
    return max(0, first + layers - max(first, kept_from))


def offloaded_on_gpu(shape: ModelShape, recipe: Recipe, first: int, layers: int) -> int:
    """Of the `layers` layers from index `first` on one GPU, those that offload: the trainer
    offloads the ones just before the kept ones (`offloaded_layers`), the first ones recompute."""
    kept_from = shape.layers - kept_layers(shape, recipe)
    offloaded_from = kept_from - offloaded_layers(shape, recipe)
    return max(0, min(first + layers, kept_from) - max(first, offloaded_from))


def offload_in_flight(kept: int) -> int:
    """Offloaded layers' activations on the GPU besides the kept ones: at most two layers cross
    at once (the forward waits for the copies two layers back; the backward runs one layer while
    the next comes back), and the kept layers, last in the forward and first in the backward,
    give back room for as many of them as they are."""
    return max(0, 2 - kept)


def inputs_offloaded(recipe: Recipe) -> bool:
    """Whether recomputing layers keep their inputs in host memory (offloaded layers move all)."""
    return recipe.offload_inputs and recipe.gradient_checkpointing and not recipe.offload


def _offloaded_of(recipe: Recipe, rest: int) -> int:
    """Of `rest` layers that do not keep their activations, those that offload."""
    if not recipe.offload:
        return 0
    return rest if recipe.max_offloaded is None else min(rest, recipe.max_offloaded)


def activations_on_gpu(
    shape: ModelShape, recipe: Recipe, layers: int, kept: int, offloaded: int | None = None
) -> float:
    """What `layers` layers leave resident after the forward, `kept` of them keeping everything,
    `offloaded` nothing but the layers still crossing (default: the rest, at most
    `recipe.max_offloaded`), and the rest their input (checkpointed; in host memory but the two
    crossing, with `offload_inputs`)."""
    rest = layers - kept
    if offloaded is None:
        offloaded = _offloaded_of(recipe, rest)
    recomputing = rest - offloaded
    full = full_layer_activation_bytes(shape, recipe)
    crossing = min(offloaded, offload_in_flight(kept)) * full
    if recomputing and inputs_offloaded(recipe):
        return kept * full + min(recomputing, 2) * checkpoint_bytes_per_layer(shape, recipe)
    return kept * full + crossing + recomputing * checkpoint_bytes_per_layer(shape, recipe)


def layer_pass_temporaries(
    shape: ModelShape, recipe: Recipe, layers: int, kept: int, offloaded: int | None = None
) -> float:
    """Transient bytes while the first layer runs backward (the model's last: every other layer's
    activations are still held), the larger of its two phases, measured apart
    (bench/results/2026-12-02-h200-parts.json):
    - the MLP's backward: the dequantised weight of the largest linear and intermediate-wide
      gradients;
    - the attention's backward, after the MLP's has freed what the MLP kept: the probabilities'
      and the scores' gradients beside the probabilities.
    A layer that did not keep its activations has them again first: recomputed, or fetched back
    (the crossing layers are counted resident, `activations_on_gpu`). The backward runs the kept
    layers (the last) first and frees what each kept, so with one layer kept or more a
    checkpointed layer's recompute fits in what the kept ones gave back: only a GPU that keeps
    none needs a layer more; so does an offloaded one, which the backward reaches before the
    recomputing ones. `layers`: the GPU's decoder layers, `kept` of them keeping theirs,
    `offloaded` offloading theirs (default: `activations_on_gpu`'s)."""
    if layers == 0:
        return 0.0
    if offloaded is None:
        offloaded = _offloaded_of(recipe, layers - kept)
    per_token = recipe.tokens * recipe.compute_bytes
    dequantised = shape.largest_linear_params * recipe.compute_bytes if recipe.quantization != "none" else 0.0
    mlp = dequantised + cal.MLP_GRADIENT_FLOATS * per_token * shape.intermediate
    mlp_freed = per_token * (
        cal.ACTIVATION_INTERMEDIATE_FLOATS * shape.intermediate + cal.MLP_FREED_HIDDEN_FLOATS * shape.hidden
    )
    if keeps_attention_matrix(recipe):
        copies = cal.ATTENTION_MATRIX_COPIES_BACKWARD + (cal.SOFTCAP_SAVED_COPIES if shape.attention_softcap else 0.0)
        attention = copies * attention_matrix_bytes(shape, recipe) - mlp_freed
    else:
        attention = cal.FUSED_ATTENTION_BACKWARD_FLOATS * per_token * shape.attention_width - mlp_freed
    recomputes = layers > kept + offloaded and kept == 0 and offloaded == 0
    recompute = full_layer_activation_bytes(shape, recipe) if recomputes else 0.0
    if layers > kept and inputs_offloaded(recipe):
        # The backward holds the recomputing layer's input and the next one's, fetched ahead: one
        # more than the forward leaves crossing (measured: 70B slice, 12 layers at 8192 tokens,
        # bench/results/2026-12-04-h200-boundary-long-inputs.json).
        recompute += checkpoint_bytes_per_layer(shape, recipe)
    return recompute + max(mlp, attention)


def saved_storages(shape: ModelShape, recipe: Recipe) -> list[float]:
    """Bytes of each storage one layer saves for its backward when it is not checkpointed, one
    entry per tensor (calibration.py lists them): hidden-, attention- and intermediate-wide ones;
    with the fused attention its output (unless the o adapter keeps that very tensor as its input,
    without dropout) and one log-sum-exp per head; the adapters' inputs (without dropout one per
    group of linears reading the same tensor, with dropout each adapter's dropped copy and its
    one-byte mask); the attention probabilities where the kernel keeps them."""
    per_float = recipe.tokens * recipe.compute_bytes
    widths = [float(shape.hidden)] * round(cal.ACTIVATION_HIDDEN_FLOATS)
    widths += [float(shape.attention_width)] * round(cal.ACTIVATION_ATTENTION_FLOATS)
    widths += [float(shape.intermediate)] * round(cal.ACTIVATION_INTERMEDIATE_FLOATS)
    if not keeps_attention_matrix(recipe):
        output_shared = "o_proj" in recipe.lora_targets and not recipe.lora_dropout
        widths += [] if output_shared else [float(shape.attention_width)]
        widths.append(float(shape.heads))  # the log-sum-exp
    dims = shape.linear_dims()
    adapted = [t for t in recipe.lora_targets if t in dims]
    masks: list[float] = []
    if recipe.lora_dropout:
        # Each adapter's dropped copy of its input, and the dropout's one-byte mask of it.
        widths += [float(dims[t][0]) for t in adapted]
        masks = [recipe.tokens * dims[t][0] * (cal.DROPOUT_FLOATS_PER_INPUT - 1) * FP32 for t in adapted]
    else:
        widths += [float(w) for w in (next((dims[t][0] for t in g if t in adapted), 0) for g in INPUT_GROUPS) if w]
    copies = cal.ATTENTION_MATRIX_COPIES_SAVED + (cal.SOFTCAP_SAVED_COPIES if shape.attention_softcap else 0.0)
    matrices = [attention_matrix_bytes(shape, recipe)] * round(copies) if keeps_attention_matrix(recipe) else []
    return [w * per_float for w in widths] + masks + matrices


# Threads that run matmuls in a training step, each with its own cuBLAS handle and workspace: the
# forward's (the trainer's thread) and the backward's (autograd's worker for the device).
CUBLAS_HANDLES: Final = 2


def cublas_workspace_bytes(product: GpuProduct) -> float:
    """cuBLAS workspaces, which PyTorch takes from its caching allocator at a thread's first matmul
    and keeps: in `allocated` from the first step on. Planned without them, every held-out point
    on an H200 measured 0.057-0.059 GiB more resident than planned beside the adapters' gradients
    (bench/results/2026-12-05-h200-heldout-*.json), 0.02-0.06 GiB above the plan's peak where the
    adapters are small."""
    return CUBLAS_HANDLES * product.cublas_workspace_mib * 2**20


def logits_bytes(shape: ModelShape, recipe: Recipe) -> float:
    """Transient bytes of the loss: FP32 logits for the whole micro-batch, or for one chunk. The
    loss head chunks the micro-batch's positions flattened, rows one after the other
    (finetune_trainer/model/loss_head.py), so a chunk is `loss_chunk_tokens` positions whatever the
    batch: planned per row, a batch of 4 x 512 tokens with chunks of 512 was planned as a whole
    loss, 2.1 GiB above its measured peak (bench/results/2026-12-01-h200-boundary.json). GRPO's
    head scores the completions alone (`Recipe.head_tokens`): planned over the whole sequences, the
    70B slice's GRPO step was planned 5.9 GiB of loss where 0.63 was measured
    (bench/results/2026-12-07-h100-80gb-hbm3-grpo.json)."""
    copies = cal.LOGITS_COPIES + (cal.SOFTCAP_SAVED_COPIES if shape.logit_softcap else 0.0)
    tokens = recipe.head_tokens
    if recipe.loss_chunk_tokens and recipe.loss_chunk_tokens < tokens:
        chunk = recipe.loss_chunk_tokens * shape.vocab * FP32
        return copies * chunk + tokens * shape.hidden * FP32
    return copies * tokens * shape.vocab * FP32


def logits_block_bytes(shape: ModelShape, recipe: Recipe) -> float:
    """One block of the micro-batch's seq x vocab FP32 logits: what a whole-sequence loss needs
    to spare beyond the planner's margin (measured: one planned with 0.2 GiB to spare asked for a
    4 GiB block beyond the cap)."""
    return recipe.batch_size * recipe.max_length * shape.vocab * FP32


def adapter_gradient_sum_bytes(shape: ModelShape, recipe: Recipe) -> float:
    """The flat buffer in which a rank sums the adapter's gradients with the other ranks'
    (dataParallel, and fsdp, which keeps the adapter outside its units)."""
    return shape.layers * shape.lora_params_per_layer(recipe.lora_r, recipe.lora_targets) * FP32


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's peak: resident bytes plus the larger of the two transient phases (a layer's
    backward, or the loss), plus CUDA context and allocator slack."""

    index: int
    layers: int
    quantised_weights: float
    embeddings_head: float
    norms: float
    lora_optimizer: float
    activations: float
    temporaries: float
    logits: float
    capacity: float
    notes: tuple[str, ...] = field(default=())
    workspaces: float = 0.0  # cuBLAS's, from the first step on (`cublas_workspace_bytes`)
    # GRPO's phases without gradients at their largest (`grpo.phases`): the rollouts (their KV
    # cache and forwards) or the scored micro-batch's forwards without gradients, above what
    # stays. They hold none of a trained pass's activations: a step's rollouts run before any
    # gradient, a forward without gradients before its micro-batch's trained one. 0: another method.
    rollouts: float = 0.0

    @property
    def held(self) -> float:
        """What stays through every phase: the weights, the adapter and its optimizer, the workspaces."""
        return self.quantised_weights + self.embeddings_head + self.norms + self.lora_optimizer + self.workspaces

    @property
    def resident(self) -> float:
        return self.held + self.activations

    @property
    def allocated(self) -> float:
        """What torch.cuda.max_memory_allocated would report at the peak: the trained pass's, or
        GRPO's phases without gradients where they need more."""
        return max(self.resident + max(self.temporaries, self.logits), self.held + self.rollouts)

    @property
    def overhead(self) -> float:
        return cal.CUDA_CONTEXT_GIB * GIB + cal.ALLOCATOR_SLACK * self.allocated

    @property
    def total(self) -> float:
        return self.allocated + self.overhead

    @property
    def headroom(self) -> float:
        return self.capacity - self.total

    def parts_gib(self) -> dict[str, float]:
        """The parts as the trainer's phase probe measures them (finetune_trainer.memory.phases):
        resident, activations, and the backward's and the loss's transients above them."""
        parts = {
            "resident": self.resident - self.activations,
            "activations": self.activations,
            "backward": self.temporaries,
            "loss": self.logits,
            **({"rollouts": self.rollouts} if self.rollouts else {}),
            "allocated": self.allocated,
            "total": self.total,
        }
        return {name: round(value / GIB, 3) for name, value in parts.items()}

    @property
    def peak_phase(self) -> str:
        if self.held + self.rollouts > self.resident + max(self.temporaries, self.logits):
            return "rollouts"
        return "loss" if self.logits > self.temporaries else "layer backward"

"""fsdp: one process per GPU, each holding 1/N of every weight, gathering a layer's whole
weights just before it runs; every GPU computes its own micro-batches.

The wrapping, and what each rank therefore holds, is `fsdp_layout`'s docstring: it is the
trainer's (`finetune_trainer/modes/fsdp.py`), term by term.
"""

from __future__ import annotations

from dataclasses import replace

from .. import calibration as cal
from .. import memory as mem
from ..grpo.phases import fsdp_no_grad_bytes
from ..memory import GIB, GpuMemory, Recipe
from ..model_shape import ModelShape
from ..results.layout import Hardware, Layout


def fsdp_layout(shape: ModelShape, recipe: Recipe, hw: Hardware, *, embeddings_in_root: bool = False) -> Layout:
    """FSDP (torch FSDP1, FULL_SHARD, one process per GPU) with the units the trainer wraps:

    - one unit per decoder layer: its NF4 linears, stored as float32 (`bnb_4bit_quant_storage`;
      the packed bytes are those of uint8 storage) and its two norms, all frozen;
    - the LoRA adapters outside FSDP altogether (`ignored_states`), so that no unit mixes frozen
      and trainable parameters: FSDP allocates a gradient for a whole flat parameter, so a layer
      unit holding its adapters would keep a sharded gradient as large as its NF4 shard (8 GiB a
      GPU for 70B on four). Each rank keeps the adapter whole and sums its gradients in one
      collective, exactly as dataParallel does (`finetune_trainer/modes/fsdp.py`);
    - `embed_tokens` and `lm_head` in units of their own, gathered only while they run. FSDP1
      never reshards the root unit after its forward (it expects the backward to need it at
      once), so whatever stays in the root is held whole from the first forward to the end of
      the backward: `embeddings_in_root=True` plans that wrapping (the FP32 embeddings and head
      of 70B are 7.8 GiB per GPU). A tied head shares the embedding's parameter, which FSDP
      must keep in one unit: the root, so a tied matrix is always planned whole.

    Each rank then holds (the terms of the returned GpuMemory):
    - quantised_weights: 1/N of every layer's packed 4-bit bytes, plus the whole quantisation
      state (absmax and nested absmax are module attributes, not parameters: FSDP neither shards
      nor syncs them, so every rank keeps all of it);
    - embeddings_head: 1/N of the embedding and head (own units), or the whole matrices plus
      their 1/N shard (root unit, or tied);
    - norms: 1/N of every norm (the final norm sits in the root, whole: 32 KiB);
    - lora_optimizer: the whole adapter, its gradients, the optimizer state and the flat buffer
      of the gradient sum (about 0.4 GiB for 70B at r=8 on q/k/v/o);
    - activations: what one data-parallel rank keeps, since every rank runs whole sequences;
    - temporaries (a layer's backward): the single-GPU layer pass plus two layers gathered whole
      (the running one and the one prefetched for the next backward step);
    - logits (the loss): the logits' transients plus the head gathered whole (own unit; the root
      already holds it whole);
    - in both transient phases, what fsdp was measured to hold beyond these parts
      (`cal.FSDP_UNMEASURED_GIB`);
    - rollouts (GRPO's phases without gradients, `grpo.phases`): a forward's layer beside two
      layers gathered whole, or its logits beside the head gathered, and the same unmeasured term.
    """
    n = hw.gpus
    layers = shape.layers
    packed = mem.layer_packed_bytes(shape, recipe)
    constants = shape.linear_params_per_layer * mem.quant_constant_bytes_per_param(recipe)
    embedding = mem.embedding_bytes(shape, recipe)
    head = mem.head_bytes(shape)
    whole_in_root = embeddings_in_root or shape.tied_embeddings
    embeddings_head = (embedding + head) * (1 + 1 / n) if whole_in_root else (embedding + head) / n
    outside = mem.outside_layers_activation_bytes(shape, recipe) + mem.attention_mask_bytes(recipe)
    unmeasured = cal.FSDP_UNMEASURED_GIB * GIB
    lora_grads = mem.adapter_gradient_sum_bytes(shape, recipe)
    kept = mem.kept_layers(shape, recipe)
    gathered = 2 * (packed + mem.norm_bytes_per_layer(shape)) + unmeasured
    head_gathered = (0.0 if whole_in_root else head) + unmeasured
    gpu = GpuMemory(
        index=0,
        layers=layers,
        quantised_weights=layers * (packed / n + constants),
        embeddings_head=embeddings_head,
        norms=layers * mem.norm_bytes_per_layer(shape) / n + shape.hidden * mem.FP32,
        lora_optimizer=layers * mem.lora_state_bytes_per_layer(shape, recipe) + lora_grads,
        activations=mem.activations_on_gpu(shape, recipe, layers, kept) + outside,
        temporaries=mem.layer_pass_temporaries(shape, recipe, layers, kept) + gathered,
        logits=mem.logits_bytes(shape, recipe) + head_gathered,
        capacity=hw.capacity,
        workspaces=mem.cublas_workspace_bytes(hw.product),
        rollouts=fsdp_no_grad_bytes(shape, recipe, gathered=gathered, head_gathered=head_gathered),
    )
    return Layout("fsdp", tuple(replace(gpu, index=i) for i in range(n)), recipe.loss_chunk_tokens)

"""The plan: does this job fit these GPUs, in which mode, with what per-GPU peak, how fast.

Modes (all one pod; in the spec's words `deviceMap`, `dataParallel`, `fsdp`, see finetune_api.modes):
- device_map: one process; layers in contiguous blocks over the GPUs (GPU 0 also holds the
  embeddings, the last GPU the head and the loss). Only one GPU computes at a time.
- data_parallel: one process per GPU, each with a full NF4 copy and its own micro-batches.
- fsdp: one process per GPU, each holding 1/N of every weight and gathering a layer's full
  weights just before it runs; every GPU computes its own micro-batches.
`auto` picks the fastest mode that fits; on one GPU every mode is the whole model on that GPU,
and `auto` names it data_parallel (the world-size-1 case).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, cast

from finetune_api.modes import MODES, processes, to_spec

from . import calibration as cal
from . import memory as mem
from . import pairs
from .gpu_products import GpuProduct
from .host_limit import HostLimit
from .memory import GIB, GpuMemory, Recipe
from .model_shape import ModelShape
from .placement import QUANTISED_ACCOUNTING_BYTES, Placement, balance, max_memory
from .recompute import ActivationAsk, Activations, Choice, LayerLayout, candidates, describe, most_kept, roomy
from .speed import Mode, Speed, estimate

ModeChoice = Literal["auto", "device_map", "data_parallel", "fsdp"]
# Every mode the planner lays out, in the order of finetune_api.modes.MODES.
ALL_MODES: Final[tuple[Mode, ...]] = cast(tuple[Mode, ...], tuple(m.planner for m in MODES))
# Chunk of tokens per loss step when the full-sequence logits do not fit.
LOSS_CHUNK_TOKENS: Final = 512
MAX_GPUS: Final = 64


@dataclass(frozen=True)
class Hardware:
    """The GPUs one pod gets: how many, which product, and how much memory each has."""

    gpus: int
    product: GpuProduct
    memory_gib: float

    @property
    def capacity(self) -> float:
        return self.memory_gib * GIB

    def with_gpus(self, gpus: int) -> Hardware:
        return replace(self, gpus=gpus)


@dataclass(frozen=True)
class Layout:
    """One mode's memory on every GPU."""

    mode: Mode
    per_gpu: tuple[GpuMemory, ...]
    loss_chunk_tokens: int
    placement: Placement | None = None

    @property
    def fits(self) -> bool:
        return all(g.headroom >= 0 for g in self.per_gpu)

    @property
    def fullest(self) -> GpuMemory:
        return min(self.per_gpu, key=lambda g: g.headroom)

    @property
    def shortfall(self) -> float:
        return max(0.0, -self.fullest.headroom)


@dataclass(frozen=True)
class Plan:
    fits: bool
    mode: Mode
    hardware: Hardware
    shape: ModelShape
    recipe: Recipe
    layout: Layout
    speed: Speed | None
    message: str
    alternatives: tuple[Layout, ...] = ()
    suggestions: tuple[str, ...] = ()
    device_map: dict[str, int] | None = None
    max_memory: dict[int, int] | None = None
    activations: Activations | None = None
    # The most host memory the pod may have (None: unbounded, the planner's own tests).
    host_limit: HostLimit | None = None
    # Why the pod does not fit a node's host memory (a GPU plan that fits, but too much pinned).
    host_refusal: str | None = None
    # With the pair split: the closest the unsplit micro-batch came (what it would need).
    unsplit: Layout | None = None

    @property
    def pinned_host_gib_per_process(self) -> float:
        """Pinned host memory of the offloaded activations, per process."""
        return mem.offload_host_bytes(self.shape, self.recipe) / GIB

    @property
    def parallelism(self) -> str:
        """The mode in the spec's words: dataParallel, fsdp or deviceMap."""
        return to_spec(self.mode)

    @property
    def per_gpu(self) -> tuple[GpuMemory, ...]:
        return self.layout.per_gpu

    @property
    def host_gib_per_process(self) -> float:
        """What one process holds on the host at its peak (the load), in GiB."""
        pinned = mem.offload_host_bytes(self.shape, self.recipe)
        return (mem.host_bytes_per_process(self.shape, self.recipe) + pinned) / GIB

    @property
    def whole_load_host_gib_per_process(self) -> float | None:
        """fsdp over several GPUs on a checkpoint it cannot stream: the whole packed model per
        process (the trainer refuses that load when the pod's memory is below it)."""
        if self.mode != "fsdp" or self.hardware.gpus <= 1:
            return None
        return mem.whole_load_host_bytes_per_process(self.shape, self.recipe) / GIB

    @property
    def shortfall_gib(self) -> float:
        return self.layout.shortfall / GIB

    @property
    def summary(self) -> dict[str, Any]:
        """A compact record for the trainer's log and status."""
        return {
            "fits": self.fits,
            "parallelism": self.parallelism,
            "loss_chunk_tokens": self.layout.loss_chunk_tokens,
            "per_gpu_total_gib": {f"cuda:{g.index}": round(g.total / GIB, 2) for g in self.per_gpu},
            "min_headroom_gib": round(self.layout.fullest.headroom / GIB, 2),
            "host_gib_per_process": _rounded(self.host_gib_per_process),
            "whole_load_host_gib_per_process": _rounded(self.whole_load_host_gib_per_process),
            "tokens_per_second": None if self.speed is None else round(self.speed.tokens_per_second, 1),
            **self.activation_summary,
            **self.pair_summary,
            "message": self.message,
        }

    @property
    def pair_summary(self) -> dict[str, Any]:
        """How a row's sequences go through the model and what the forwards without gradients
        cost (an objective of one sequence a row without them: nothing)."""
        recipe, speed = self.recipe, self.speed
        out: dict[str, Any] = {}
        if recipe.sequences_per_row > 1:
            out["pair_split"] = recipe.pair_split
            out["sequences_per_pass"] = recipe.batch_size
        if recipe.reference_forwards:
            out["reference_forwards"] = recipe.reference_forwards
            out["reference_seconds"] = None if speed is None else round(speed.reference_seconds, 3)
        if recipe.pair_split:
            out["split_forward_seconds"] = None if speed is None else round(speed.split_seconds, 3)
        return out

    @property
    def layers(self) -> LayerLayout:
        """Which layers keep, recompute or offload their activations: what the trainer applies."""
        return LayerLayout.of(self.shape, self.recipe)

    @property
    def activation_summary(self) -> dict[str, Any]:
        """The layers' layout in the summary's words (the trainer's log and status)."""
        act, layers = self.activations, self.layers
        return {
            "gradient_checkpointing": self.recipe.gradient_checkpointing,
            "kept_layers": layers.kept,
            "recomputed_layers": layers.recomputed,
            "offloaded_layers": layers.offloaded,
            "inputs_offloaded": layers.inputs_offloaded,
            "pinned_host_gib_per_process": round(self.pinned_host_gib_per_process, 2),
            "checkpointing": None if act is None else act.checkpointing,
            "offload": None if act is None else act.offload,
            "all_recompute_tokens_per_second": None
            if act is None or act.all_recompute_tokens_per_second is None
            else round(act.all_recompute_tokens_per_second, 1),
        }

    def to_dict(self) -> dict[str, Any]:
        speed: dict[str, Any] | None = None
        if self.speed is not None:
            speed = {
                "flops_per_token": self.speed.flops_per_token,
                "tokens_per_second": round(self.speed.tokens_per_second, 2),
                "step_seconds": round(self.speed.step_seconds, 3),
                "bound": self.speed.bound,
                "epoch_tokens": self.speed.epoch_tokens,
                "seconds_per_epoch": None
                if self.speed.seconds_per_epoch is None
                else round(self.speed.seconds_per_epoch, 1),
                "reference_seconds": round(self.speed.reference_seconds, 3),
                "split_forward_seconds": round(self.speed.split_seconds, 3),
            }
        return {
            "fits": self.fits,
            "parallelism": self.parallelism,
            "message": self.message,
            "gpus": self.hardware.gpus,
            "gpu_product": self.hardware.product.name,
            "gpu_memory_gib": self.hardware.memory_gib,
            "model": {
                "name": self.shape.name,
                "parameters": self.shape.total_params,
                "layers": self.shape.layers,
                "hidden": self.shape.hidden,
            },
            "max_length": self.recipe.max_length,
            "batch_size": self.recipe.rows,
            **self.activation_summary,
            **self.pair_summary,
            "pairs": pairs.describe(self.recipe),
            "loss_chunk_tokens": self.layout.loss_chunk_tokens,
            "shortfall_gib": round(self.shortfall_gib, 2),
            "host_gib_per_process": _rounded(self.host_gib_per_process),
            "host_limit": None
            if self.host_limit is None
            else {
                "gib": round(self.host_limit.limit / GIB, 2),
                "source": self.host_limit.describe(),
                "detail": self.host_limit.detail or None,
            },
            "per_gpu": [gpu_dict(g) for g in self.per_gpu],
            "alternatives": [
                {
                    "parallelism": to_spec(a.mode),
                    "fits": a.fits,
                    "max_total_gib": round(a.fullest.total / GIB, 2),
                    "loss_chunk_tokens": a.loss_chunk_tokens,
                }
                for a in self.alternatives
            ],
            "suggestions": list(self.suggestions),
            "device_map": self.device_map,
            "max_memory": None if self.max_memory is None else {str(k): v for k, v in self.max_memory.items()},
            "speed": speed,
        }


def gpu_dict(g: GpuMemory) -> dict[str, Any]:
    def gib(value: float) -> float:
        return round(value / GIB, 3)

    return {
        "index": g.index,
        "layers": g.layers,
        "quantised_weights_gib": gib(g.quantised_weights),
        "embeddings_head_gib": gib(g.embeddings_head),
        "norms_gib": gib(g.norms),
        "lora_optimizer_gib": gib(g.lora_optimizer),
        "workspaces_gib": gib(g.workspaces),
        "activations_gib": gib(g.activations),
        "temporaries_gib": gib(g.temporaries),
        "logits_gib": gib(g.logits),
        "overhead_gib": gib(g.overhead),
        "allocated_gib": gib(g.allocated),
        "total_gib": gib(g.total),
        "capacity_gib": gib(g.capacity),
        "headroom_gib": gib(g.headroom),
        "peak_phase": g.peak_phase,
    }


# --- per-mode memory ---------------------------------------------------------------------


def _device_map_gpu(
    shape: ModelShape, recipe: Recipe, hw: Hardware, gpu: int, layers: int, *, first: int | None = None
) -> GpuMemory:
    """GPU `gpu` holding `layers` decoder layers from index `first` (default: the last ones on the
    last GPU, else the first ones: where the kept layers would be without a placement)."""
    last = hw.gpus - 1
    if first is None:
        first = shape.layers - layers if gpu == last else 0
    kept = mem.kept_on_gpu(shape, recipe, first, layers)
    offloaded = mem.offloaded_on_gpu(shape, recipe, first, layers)
    # A tied head is the embedding matrix: accelerate keeps it with the embeddings on GPU 0.
    loss_gpu = 0 if shape.tied_embeddings else last
    embeddings_head = (mem.embedding_bytes(shape, recipe) if gpu == 0 else 0.0) + (
        mem.head_bytes(shape) if gpu == loss_gpu else 0.0
    )
    outside = mem.outside_layers_activation_bytes(shape, recipe) if gpu == loss_gpu else 0.0
    # The mask is built on GPU 0; each layer on a later GPU gets (and keeps) its own copy there.
    outside += mem.attention_mask_bytes(recipe) * (1 if gpu == 0 else layers)
    return GpuMemory(
        index=gpu,
        layers=layers,
        quantised_weights=layers * mem.layer_weight_bytes(shape, recipe),
        embeddings_head=embeddings_head,
        norms=layers * mem.norm_bytes_per_layer(shape) + (shape.hidden * mem.FP32 if gpu == last else 0.0),
        lora_optimizer=layers * mem.lora_state_bytes_per_layer(shape, recipe),
        activations=mem.activations_on_gpu(shape, recipe, layers, kept, offloaded) + outside,
        temporaries=mem.layer_pass_temporaries(shape, recipe, layers, kept, offloaded),
        logits=mem.logits_bytes(shape, recipe) if gpu == loss_gpu else 0.0,
        capacity=hw.capacity,
        workspaces=mem.cublas_workspace_bytes(hw.product),
    )


def device_map_layout(shape: ModelShape, recipe: Recipe, hw: Hardware, placement: Placement | None = None) -> Layout:
    """device_map memory per GPU, for the balanced placement or a given one."""

    # Balanced as if every layer recomputed: the layers kept (the last) then add to the GPUs that
    # hold them, which `gradientCheckpointing: auto` sizes against each GPU's headroom.
    even = replace(recipe, kept_layers=0)

    def total_for(gpu: int, count: int) -> float:
        return _device_map_gpu(shape, even, hw, gpu, count).total

    if placement is None:
        placement = balance(shape.layers, [hw.capacity] * hw.gpus, total_for)
    firsts = [sum(placement.layers_per_gpu[:gpu]) for gpu in range(len(placement.layers_per_gpu))]
    per_gpu = tuple(
        _device_map_gpu(shape, recipe, hw, gpu, count, first=firsts[gpu])
        for gpu, count in enumerate(placement.layers_per_gpu)
    )
    return Layout("device_map", per_gpu, recipe.loss_chunk_tokens, placement)


def data_parallel_layout(shape: ModelShape, recipe: Recipe, hw: Hardware) -> Layout:
    one = _device_map_gpu(shape, recipe, hw.with_gpus(1), 0, shape.layers)
    # The flat all-reduce buffer of the adapter gradients.
    grads = shape.layers * shape.lora_params_per_layer(recipe.lora_r, recipe.lora_targets) * mem.FP32
    one = replace(one, lora_optimizer=one.lora_optimizer + grads)
    return Layout("data_parallel", tuple(replace(one, index=i) for i in range(hw.gpus)), recipe.loss_chunk_tokens)


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
      (`cal.FSDP_UNMEASURED_GIB`).
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
    lora_grads = layers * shape.lora_params_per_layer(recipe.lora_r, recipe.lora_targets) * mem.FP32
    kept = mem.kept_layers(shape, recipe)
    gpu = GpuMemory(
        index=0,
        layers=layers,
        quantised_weights=layers * (packed / n + constants),
        embeddings_head=embeddings_head,
        norms=layers * mem.norm_bytes_per_layer(shape) / n + shape.hidden * mem.FP32,
        lora_optimizer=layers * mem.lora_state_bytes_per_layer(shape, recipe) + lora_grads,
        activations=mem.activations_on_gpu(shape, recipe, layers, kept) + outside,
        temporaries=mem.layer_pass_temporaries(shape, recipe, layers, kept)
        + 2 * (packed + mem.norm_bytes_per_layer(shape))
        + unmeasured,
        logits=mem.logits_bytes(shape, recipe) + (0.0 if whole_in_root else head) + unmeasured,
        capacity=hw.capacity,
        workspaces=mem.cublas_workspace_bytes(hw.product),
    )
    return Layout("fsdp", tuple(replace(gpu, index=i) for i in range(n)), recipe.loss_chunk_tokens)


def layout_for(mode: Mode, shape: ModelShape, recipe: Recipe, hw: Hardware) -> Layout:
    if hw.gpus == 1:
        # One process holding the whole model, whatever the mode is called: FSDP over one rank
        # switches itself to NO_SHARD, and data-parallel of one has nothing to average.
        return replace(device_map_layout(shape, recipe, hw), mode=mode)
    if mode == "device_map":
        return device_map_layout(shape, recipe, hw)
    if mode == "data_parallel":
        return data_parallel_layout(shape, recipe, hw)
    return fsdp_layout(shape, recipe, hw)


def _modes(choice: ModeChoice, hw: Hardware, allowed: Sequence[Mode]) -> list[Mode]:
    if choice != "auto":
        return [choice]
    modes = [m for m in ALL_MODES if m in allowed]
    return modes[:1] if hw.gpus == 1 else modes


def _best_layout(
    shape: ModelShape, recipe: Recipe, hw: Hardware, modes: Sequence[Mode], loss_chunks: Sequence[int]
) -> tuple[Layout, list[Layout]]:
    """The fastest layout that fits, else the one closest to fitting; plus each mode's best."""
    per_mode: list[Layout] = []
    for mode in modes:
        tried = [layout_for(mode, shape, replace(recipe, loss_chunk_tokens=c), hw) for c in loss_chunks]
        per_mode.append(_safest(tried, shape, recipe))
    fitting = [layout for layout in per_mode if layout.fits]
    if fitting:

        def rate(layout: Layout) -> float:
            r = replace(recipe, loss_chunk_tokens=layout.loss_chunk_tokens)
            return estimate(shape, r, hw.product, gpus=hw.gpus, mode=layout.mode).tokens_per_second

        return max(fitting, key=rate), per_mode
    return min(per_mode, key=lambda t: t.shortfall), per_mode


def _safest(tried: Sequence[Layout], shape: ModelShape, recipe: Recipe) -> Layout:
    """Of one mode's layouts (one per loss chunk size, in the trainer's order), the first that fits
    with room to spare, else a fitting one with the loss in chunks, else the first that fits, else
    the closest to fitting. The chunked loss keeps the math; a whole-sequence loss needs a spare
    logits block besides (measured: one planned with 0.2 GiB to spare asked for a 4 GiB block of
    seq x vocab floats beyond the cap), and every plan `cal.SHORT_HEADROOM_GIB`."""
    fitting = [t for t in tried if t.fits]
    if not fitting:
        return min(tried, key=lambda t: t.shortfall)
    block = recipe.batch_size * recipe.max_length * shape.vocab * mem.FP32

    def roomy(t: Layout) -> bool:
        return t.fullest.headroom >= cal.SHORT_HEADROOM_GIB * GIB + (0 if t.loss_chunk_tokens else block)

    chunked = [t for t in fitting if t.loss_chunk_tokens]
    return next((t for t in fitting if roomy(t)), chunked[0] if chunked else fitting[0])


def _rate(shape: ModelShape, recipe: Recipe, hw: Hardware, mode: Mode) -> float:
    return estimate(shape, recipe, hw.product, gpus=hw.gpus, mode=mode).tokens_per_second


def _sized(
    shape: ModelShape, recipe: Recipe, hw: Hardware, mode: Mode, *, chunks: Sequence[int], offload: bool
) -> tuple[Layout, Recipe] | None:
    """`auto`: of the loss chunk sizes, the layout with the most layers kept under the margin
    that runs fastest; None when even all-recompute leaves no margin."""
    block = recipe.batch_size * recipe.max_length * shape.vocab * mem.FP32
    best: tuple[float, Layout, Recipe] | None = None
    for start in candidates(recipe, chunks, offload):

        def layout_keeping(kept: int, start: Recipe = start) -> Layout:
            return layout_for(mode, shape, replace(start, kept_layers=kept), hw)

        def fits(kept: int, start: Recipe = start) -> bool:
            return roomy(layout_keeping(kept).fullest.headroom, start.loss_chunk_tokens, block)

        kept = most_kept(shape.layers, fits)
        if kept is None:
            continue
        sized = replace(start, kept_layers=kept)
        rate = _rate(shape, sized, hw, mode)
        if best is None or rate > best[0]:
            best = (rate, layout_keeping(kept), sized)
    return None if best is None else (best[1], best[2])


def _activations(
    shape: ModelShape,
    recipe: Recipe,
    hw: Hardware,
    layout: Layout,
    *,
    chunks: Sequence[int],
    ask: ActivationAsk,
    host_limit: HostLimit | None = None,
) -> tuple[Layout, Activations]:
    """The layers that keep, recompute or offload their activations, for a layout that fits.
    `host_limit`: the pod's most host memory (what offload `auto` pins must fit it with the rest
    of the pod's plan)."""
    plain = replace(recipe, loss_chunk_tokens=layout.loss_chunk_tokens, kept_layers=0, offload=False)
    all_recompute = replace(plain, gradient_checkpointing=True)
    baseline = _rate(shape, all_recompute, hw, layout.mode)
    if not ask.recomputes:
        return layout, Activations(plain, describe(shape, plain, 0.0), "off: no layer recomputes")
    wanted = ask.offloads
    offload = str(ask.offload).lower()
    inputs_why = f"the recomputing layers' inputs only (activationOffload: {offload}): what fits the GPUs"
    if ask.recomputes_all:
        chosen = replace(all_recompute, offload=wanted)
        if wanted:
            layout = layout_for(layout.mode, shape, chosen, hw)
        pinned = mem.offload_host_bytes(shape, chosen)
        why = "on (activationOffload: true)" if wanted else f"off (activationOffload: {offload})"
        why = inputs_why if mem.inputs_offloaded(chosen) else why
        return layout, Activations(chosen, describe(shape, chosen, pinned), why, baseline)
    sized = _sized(shape, all_recompute, hw, layout.mode, chunks=[layout.loss_chunk_tokens, *chunks], offload=wanted)
    if sized is None:
        note = f"recompute all {shape.layers} layers: the plan leaves no room for one more beyond the margin"
        why = "off: no room for the layer in flight" if wanted else "off: every layer recomputes"
        return layout, Activations(all_recompute, note, why, baseline)
    layout, chosen = sized
    rate = _rate(shape, chosen, hw, layout.mode)
    if wanted:
        why = "on (activationOffload: true)"
    elif ask.weighs_offload and (mem.recomputed_layers(shape, chosen) or chosen.loss_chunk_tokens):
        # Also where every layer keeps but only with the loss in chunks: each chunk's logits are
        # recomputed in the backward, and offloading some layers may leave room for a whole loss.
        layout, chosen, why = _offload_if_it_pays(
            shape,
            all_recompute,
            hw=hw,
            layout=layout,
            kept_only=chosen,
            rate=rate,
            host_limit=host_limit,
            chunks=list(dict.fromkeys([layout.loss_chunk_tokens, *chunks])),
        )
        rate = _rate(shape, chosen, hw, layout.mode)
    else:
        why = (
            "off"
            + ("" if ask.weighs_offload else " (activationOffload: false)")
            + (": no layer recomputes" if not mem.recomputed_layers(shape, chosen) else "")
        )
    if mem.inputs_offloaded(chosen) and mem.recomputed_layers(shape, chosen):
        why = inputs_why
    note = describe(shape, chosen, mem.offload_host_bytes(shape, chosen))
    note += f"; {rate:,.0f} tokens/s against {baseline:,.0f} all-recompute"
    return layout, Activations(chosen, note, why, baseline)


def _offload_if_it_pays(
    shape: ModelShape,
    all_recompute: Recipe,
    *,
    hw: Hardware,
    layout: Layout,
    kept_only: Recipe,
    rate: float,
    host_limit: HostLimit | None,
    chunks: Sequence[int],
) -> tuple[Layout, Recipe, str]:
    """`activationOffload: auto` when some layers still recompute, or the loss runs in chunks:
    offload the layers not kept instead when the plan says it is faster (each layer's copies cross
    the host link under the compute of its neighbours: `speed.offload_stall_seconds`), with the
    loss chunk size (of `chunks`) that runs fastest. Only as many layers offload as their pinned
    memory fits the pod's host memory (`host_limit`), those just before the kept ones; the first
    ones recompute, or all when not one layer fits."""
    alt = _sized(shape, all_recompute, hw, layout.mode, chunks=chunks, offload=True)
    if alt is None:
        return layout, kept_only, "off (auto): no room on the GPU for the layers in flight"
    capped = ""
    if host_limit is not None:
        most = most_offloaded(shape, alt[1], hw, alt[0].mode, host_limit)
        if most < mem.offloaded_layers(shape, alt[1]):
            full = mem.pinned_layer_bytes(shape, alt[1])
            if most < 1:
                return (
                    layout,
                    kept_only,
                    f"off (auto): not one layer's {full / GIB:.1f} GiB, pinned in each process, fits "
                    f"{host_limit.describe()} with the rest of the pod",
                )
            alt = _sized(
                shape, replace(all_recompute, max_offloaded=most), hw, layout.mode, chunks=chunks, offload=True
            )
            if alt is None:
                return layout, kept_only, "off (auto): no room on the GPU for the layers in flight"
            capped = f", {mem.offloaded_layers(shape, alt[1])} layers: what fits {host_limit.describe()}"
    alt_layout, offloaded = alt
    alt_rate = _rate(shape, offloaded, hw, alt_layout.mode)
    instead = "recomputing" if mem.recomputed_layers(shape, kept_only) else "keeping every layer, the loss in chunks"
    figures = f"{alt_rate:,.0f} tokens/s with it against {rate:,.0f} {instead}"
    if alt_rate <= rate:
        return layout, kept_only, f"off (auto): {figures}"
    return alt_layout, offloaded, f"on (auto{capped}): {figures}, the copy back a layer ahead of the backward"


def pod_bytes(shape: ModelShape, recipe: Recipe, mode: Mode, gpus: int) -> float:
    """The pod's host memory for `recipe` in `mode` on `gpus` GPUs (`host.HostNeed.pod_bytes`)."""
    per_process = mem.host_bytes_per_process(shape, recipe) + mem.offload_host_bytes(shape, recipe)
    return mem.pod_host_bytes(per_process, processes(to_spec(mode), gpus))


def most_offloaded(shape: ModelShape, recipe: Recipe, hw: Hardware, mode: Mode, host_limit: HostLimit) -> int:
    """The most layers whose activations, pinned in every process, fit `host_limit` with the rest
    of the pod (0 when not one does)."""
    room = mem.per_process_within(host_limit.limit, processes(to_spec(mode), hw.gpus))
    room -= mem.host_bytes_per_process(shape, recipe)
    full = mem.pinned_layer_bytes(shape, recipe)
    most = max(0, min(shape.layers, int(room // full))) if full > 0 else shape.layers
    # The pod's figure is rounded up to whole GiB: fewer layers may fit than the division says.
    while most > 0 and not host_limit.holds(
        pod_bytes(shape, replace(recipe, offload=True, kept_layers=0, max_offloaded=most), mode, hw.gpus)
    ):
        most -= 1
    return most


def _host_allows(shape: ModelShape, recipe: Recipe, layout: Layout, hw: Hardware, host_limit: HostLimit | None) -> bool:
    """Whether the pod's host memory holds the plan's pinned activations."""
    return host_limit is None or host_limit.holds(pod_bytes(shape, recipe, layout.mode, hw.gpus))


def _host_refusal(
    shape: ModelShape, recipe: Recipe, layout: Layout, hw: Hardware, host_limit: HostLimit | None, *, ask: ActivationAsk
) -> str | None:
    """The one-line verdict when the plan's pod needs more host memory than a node offers (a
    limit the spec sets is `host.shortfall`'s), naming the fields that would change it."""
    if host_limit is None or host_limit.from_spec or _host_allows(shape, recipe, layout, hw, host_limit):
        return None
    need = pod_bytes(shape, recipe, layout.mode, hw.gpus)
    pinned = mem.offload_host_bytes(shape, recipe)
    fixes = [host_limit.raise_it]
    if pinned and ask.offloads:
        fixes.insert(0, "set training.activationOffload: auto (it offloads what fits)")
    elif pinned:
        fixes.append("lower training.maxLength (fewer bytes pinned per layer)")
    return (
        f"does not fit the host memory: the pod needs {need / GIB:.1f} GiB ({processes(to_spec(layout.mode), hw.gpus)}"
        f" x {(mem.host_bytes_per_process(shape, recipe) + pinned) / GIB:.1f} GiB"
        + (f", {pinned / GIB:.1f} GiB of it pinned activations" if pinned else "")
        + f", + {mem.POD_HOST_MARGIN_FRACTION:.0%} + {mem.POD_HOST_MARGIN_BYTES / GIB:.0f} GiB), above "
        f"{host_limit.describe()}: " + ", or ".join(fixes)
    )


def fits_in(shape: ModelShape, recipe: Recipe, hw: Hardware, modes: Sequence[Mode], chunks: Sequence[int]) -> bool:
    """Whether any of `modes` fits the recipe on `hw` with one of the loss chunks."""
    return _best_layout(shape, recipe, hw, modes, chunks)[0].fits


def _suggestions(
    shape: ModelShape,
    recipe: Recipe,
    hw: Hardware,
    *,
    choice: ModeChoice,
    allowed: Sequence[Mode],
    chunks: Sequence[int],
) -> list[str]:
    """What would fit, in the mode asked for (auto: any allowed mode)."""
    out: list[str] = []

    def layout_on(gpus: int) -> Layout:
        more = hw.with_gpus(gpus)
        return _best_layout(shape, recipe, more, _modes(choice, more, allowed), chunks)[0]

    if hw.gpus < MAX_GPUS and layout_on(MAX_GPUS).fits:
        # More GPUs never need more memory per GPU, so the fewest that fit can be bisected.
        low, high = hw.gpus + 1, MAX_GPUS
        while low < high:
            middle = (low + high) // 2
            if layout_on(middle).fits:
                high = middle
            else:
                low = middle + 1
        out.append(f"fits on {low} x {hw.product.name} ({to_spec(layout_on(low).mode)} mode)")
    else:
        out.append(f"does not fit on up to {MAX_GPUS} x {hw.product.name} at maxLength {recipe.max_length}")
    modes = _modes(choice, hw, allowed)
    low, high = 16, recipe.max_length - 1
    if high >= low and fits_in(shape, replace(recipe, max_length=low), hw, modes, chunks):
        while low < high:
            middle = (low + high + 1) // 2
            if fits_in(shape, replace(recipe, max_length=middle), hw, modes, chunks):
                low = middle
            else:
                high = middle - 1
        out.append(f"fits on {hw.gpus} x {hw.product.name} with maxLength <= {low}")
    elif high >= low:
        weights = shape.layers * mem.layer_weight_bytes(shape, recipe) + mem.embedding_bytes(shape, recipe)
        weights += mem.head_bytes(shape)
        shortest = _best_layout(shape, replace(recipe, max_length=low), hw, modes, chunks)[0]
        out.append(
            f"no maxLength fits on {hw.gpus} x {hw.product.name} (the weights alone take "
            f"{weights / GIB:.1f} of {hw.gpus * hw.memory_gib:.1f} GiB; at maxLength {low} GPU "
            f"{shortest.fullest.index} still needs {_gib(shortest.fullest.total)})"
        )
    if recipe.rows > 1 and fits_in(shape, pairs.with_rows(recipe, 1), hw, modes, chunks):
        out.append("fits with batchSize 1 (raise gradientAccumulation to keep the effective batch)")
    if not recipe.gradient_checkpointing and fits_in(
        shape, replace(recipe, gradient_checkpointing=True), hw, modes, chunks
    ):
        out.append("fits with gradientCheckpointing: true")
    return out


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def _inputs_in_host(
    shape: ModelShape,
    recipe: Recipe,
    hardware: Hardware,
    found: tuple[Layout, list[Layout]],
    *,
    modes: list[Mode],
    chunks: Sequence[int],
    host_limit: HostLimit | None,
) -> tuple[Recipe, Layout, list[Layout], str | None]:
    """What a recomputing layer keeps, its input, can wait in host memory instead: the GPUs then
    hold two such inputs, not one per layer (80 of a 70B at 2048 tokens: 5.1 GiB per GPU). The
    recipe and layouts with the inputs in host memory where that fits the GPUs and the host, else
    `found` as it was, with the one-line refusal where only the host's memory stood in the way."""
    inputs = replace(recipe, offload_inputs=True)
    held = _best_layout(shape, inputs, hardware, modes, chunks)
    if held[0].fits and _host_allows(shape, inputs, held[0], hardware, host_limit):
        return inputs, held[0], held[1], None
    if held[0].fits and host_limit is not None:
        need = pod_bytes(shape, inputs, held[0].mode, hardware.gpus)
        refused = (
            f"the recomputing layers' inputs in host memory would fit the GPUs, but take the pod to "
            f"{_gib(need)}, above {host_limit.describe()}: {host_limit.raise_it}, or lower training.maxLength"
        )
        return recipe, found[0], found[1], refused
    return recipe, found[0], found[1], None


@dataclass(frozen=True)
class _Fit:
    """What a layout is sought among: the modes, the loss chunks, the pod's host memory."""

    modes: list[Mode]
    chunks: Sequence[int]
    host_limit: HostLimit | None


def _one_pass(
    shape: ModelShape, recipe: Recipe, hardware: Hardware, found: tuple[Layout, list[Layout]], fit: _Fit, *, holds: bool
) -> tuple[Recipe, Layout, list[Layout], str | None]:
    """`found`, or where it does not fit and every layer may recompute with `holds`, the
    recomputing layers' inputs in host memory (`_inputs_in_host`)."""
    if found[0].fits or not holds or not recipe.gradient_checkpointing:
        return recipe, found[0], found[1], None
    return _inputs_in_host(
        shape, recipe, hardware, found, modes=fit.modes, chunks=fit.chunks, host_limit=fit.host_limit
    )


def _fitted(
    shape: ModelShape, recipe: Recipe, hardware: Hardware, fit: _Fit, *, holds: bool
) -> tuple[Layout | None, Recipe, Layout, list[Layout], str | None]:
    """The recipe as planned, its closest layout and each mode's, and the refusal of its
    recomputing layers' inputs in host memory where the host alone stood in the way (`holds`:
    they may wait there). First the micro-batch in one pass (`_one_pass`); where that fits no way,
    the pair split (`pairs`), with first the closest the unsplit micro-batch came (None: no split).

    The split comes after every saver that keeps one pass (all layers recomputing, their inputs
    in host memory: copies that hide under compute) and before the verdict that nothing fits: it
    costs one more forward of every sequence, about what recomputing every layer costs, so it is
    taken only where nothing else fits. The layers kept are then sized on the split micro-batch,
    as on any other. A split that does not fit either is still the closest the plan comes: the
    verdict and its suggestions are of it (a refusal of the unsplit inputs in host memory is moot:
    the split holds fewer of them)."""
    found = _best_layout(shape, recipe, hardware, fit.modes, fit.chunks)
    recipe, unsplit, per_mode, refused = _one_pass(shape, recipe, hardware, found, fit, holds=holds)
    if unsplit.fits or not pairs.splittable(recipe):
        return None, recipe, unsplit, per_mode, refused
    if holds and recipe.gradient_checkpointing:
        held = _best_layout(shape, replace(recipe, offload_inputs=True), hardware, fit.modes, fit.chunks)[0]
        unsplit = min((unsplit, held), key=lambda t: t.shortfall)
    split = pairs.split(recipe)
    found = _best_layout(shape, split, hardware, fit.modes, fit.chunks)
    return (unsplit, *_one_pass(shape, split, hardware, found, fit, holds=holds))


def _decided(activations: Activations | None, chosen: Recipe, layout: Layout) -> str:
    """The plan's decisions beyond the mode, for its message: the layers' activations, the pair split."""
    out = "" if activations is None else f"; {activations.checkpointing}; activation offload {activations.offload}"
    if chosen.pair_split and layout.fits:
        out += f"; {pairs.describe(chosen)} (one micro-batch of both does not fit)"
    return out


def _alternatives(
    shape: ModelShape,
    recipe: Recipe,
    hardware: Hardware,
    layout: Layout,
    per_mode: list[Layout],
    *,
    mode: ModeChoice,
    modes: list[Mode],
    chunks: Sequence[int],
) -> tuple[Layout, ...]:
    """The layouts `ftjob plan` sets beside the chosen one: every mode `auto` weighed, or the asked
    mode and the modes it did not weigh."""
    if mode == "auto" and hardware.gpus > 1:
        return tuple(per_mode)
    others = (
        tuple(_best_layout(shape, recipe, hardware, [m], chunks)[0] for m in ALL_MODES if m not in modes)
        if hardware.gpus > 1
        else ()
    )
    return (layout, *others)


def _verdict(layout: Layout, alternatives: Sequence[Layout], hardware: Hardware, suggestions: list[str]) -> str:
    """The plan's one line on the GPUs: fits (peak, headroom) or not (shortfall, what to change),
    and what the other modes would need."""
    fullest = layout.fullest
    where = f"{hardware.gpus} x {hardware.product.name}"
    word = to_spec(layout.mode)
    if layout.fits:
        chunk = f", loss in chunks of {layout.loss_chunk_tokens} tokens" if layout.loss_chunk_tokens else ""
        message = (
            f"fits on {where} in {word} mode{chunk}: peak {_gib(fullest.total)} on GPU {fullest.index} "
            f"of {hardware.memory_gib:.1f} GiB ({_gib(fullest.headroom)} headroom)"
        )
    else:
        message = (
            f"does not fit on {where}: the closest is {word} mode, which needs {_gib(fullest.total)} on "
            f"GPU {fullest.index}, {_gib(layout.shortfall)} more than its {hardware.memory_gib:.1f} GiB; "
            + "; ".join(suggestions)
        )
    other_text = "; ".join(
        f"{to_spec(a.mode)} needs {_gib(a.fullest.total)} on GPU {a.fullest.index}"
        + ("" if a.fits else " (does not fit)")
        for a in alternatives
        if a.mode != layout.mode
    )
    return message + (f" (also: {other_text})" if other_text else "")


def _loading_budget(shape: ModelShape, recipe: Recipe, layout: Layout) -> dict[int, int] | None:
    """accelerate's max_memory per GPU for the placement (None without one)."""
    if layout.placement is None:
        return None
    accounting = shape.linear_params_per_layer * (
        QUANTISED_ACCOUNTING_BYTES if recipe.quantization != "none" else recipe.compute_bytes
    )
    return max_memory(layout.placement, accounting, mem.embedding_bytes(shape, recipe), mem.head_bytes(shape))


def _chunks_to_try(recipe: Recipe, loss_chunks: Sequence[int] | None) -> list[int]:
    """The loss chunk sizes to try in order: as given, else the recipe's, else the whole sequence
    then chunks of LOSS_CHUNK_TOKENS."""
    if loss_chunks is not None:
        return list(loss_chunks)
    return [recipe.loss_chunk_tokens] if recipe.loss_chunk_tokens else [0, LOSS_CHUNK_TOKENS]


def make_plan(
    shape: ModelShape,
    recipe: Recipe,
    hardware: Hardware,
    *,
    mode: ModeChoice = "auto",
    epoch_tokens: int | None = None,
    allowed_modes: Sequence[Mode] = ALL_MODES,
    loss_chunks: Sequence[int] | None = None,
    checkpointing: Choice | None = None,
    offload: Choice = False,
    host_limit: HostLimit | None = None,
) -> Plan:
    """Plan `shape` trained with `recipe` on `hardware`.

    `allowed_modes` limits `auto` to what the trainer implements; `loss_chunks` lists the loss
    chunk sizes to try in order (0 = whole-sequence logits); the default tries whole-sequence
    logits first, then chunks of LOSS_CHUNK_TOKENS, unless the recipe names a chunk size.
    `checkpointing` (`training.gradientCheckpointing`; None: the recipe's as it is) and `offload`
    (`training.activationOffload`) decide which layers keep, recompute or offload their
    activations (`recompute`); `auto` plans the mode all-recompute, then keeps what fits;
    `host_limit` (`resources.memory`, or what a node offers) bounds what offload may pin, and a
    pod above a node's offer does not fit. A micro-batch of rows of several sequences (preference
    pairs) that fits no way in one pass goes through one pass per sequence (`_fitted`).
    """
    if hardware.gpus < 1:
        raise ValueError("the planner needs at least one GPU")
    chunks = _chunks_to_try(recipe, loss_chunks)
    # `checkpointing` None: the recipe's layers as they are, nothing sized.
    ask = ActivationAsk("auto" if checkpointing is None else checkpointing, offload)
    sizing = checkpointing is not None
    if sizing:
        # The mode is planned all-recompute (auto) or as asked; the kept layers are sized after.
        recipe = replace(recipe, gradient_checkpointing=ask.recomputes, kept_layers=0, offload=False)
    modes = _modes(mode, hardware, allowed_modes)
    fit = _Fit(modes, chunks, host_limit)
    unsplit, recipe, layout, per_mode, inputs_refused = _fitted(
        shape, recipe, hardware, fit, holds=sizing and ask.may_offload
    )
    alternatives = _alternatives(shape, recipe, hardware, layout, per_mode, mode=mode, modes=modes, chunks=chunks)
    activations = None
    if layout.fits and sizing:
        layout, activations = _activations(
            shape, recipe, hardware, layout, chunks=chunks, ask=ask, host_limit=host_limit
        )
        chosen = activations.recipe
    else:
        chosen = replace(recipe, loss_chunk_tokens=layout.loss_chunk_tokens)
    speed = estimate(shape, chosen, hardware.product, gpus=hardware.gpus, mode=layout.mode, epoch_tokens=epoch_tokens)
    suggestions: list[str] = []
    if not layout.fits:
        suggestions = _suggestions(shape, recipe, hardware, choice=mode, allowed=allowed_modes, chunks=chunks)
        if inputs_refused is not None:
            suggestions.insert(0, inputs_refused)
    message = _verdict(layout, alternatives, hardware, suggestions) + _decided(activations, chosen, layout)
    host_refusal = _host_refusal(shape, chosen, layout, hardware, host_limit, ask=ask) if layout.fits else None
    if host_refusal is not None:
        suggestions = [host_refusal]
        message = f"{host_refusal} (the GPUs: {message})"
    device_map = layout.placement.device_map() if layout.placement is not None and hardware.gpus > 1 else None
    return Plan(
        fits=layout.fits and host_refusal is None,
        mode=layout.mode,
        hardware=hardware,
        shape=shape,
        recipe=chosen,
        layout=layout,
        speed=speed,
        message=message,
        alternatives=alternatives,
        suggestions=tuple(suggestions),
        device_map=device_map,
        max_memory=_loading_budget(shape, recipe, layout),
        activations=activations,
        host_limit=host_limit,
        host_refusal=host_refusal,
        unsplit=unsplit,
    )

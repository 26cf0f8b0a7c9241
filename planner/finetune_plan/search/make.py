"""`make_plan`: the search from a shape, a recipe and the hardware to a Plan.

The order: the modes' layouts with the micro-batch in one pass, the savers that keep one pass,
the pair split (`pair_split`); on what fits, the layers' activations (`recompute.choice`); then
the speed, what would fit where nothing does (`suggestions`), and the pod's host memory, which a
plan that fits the GPUs may still be above (`host`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .. import pairs
from ..grpo.timing import estimate
from ..host.budget import refused
from ..host.limit import HostLimit
from ..host.need import HostNeed, need_of
from ..layouts.device_map import loading_budget
from ..memory import Recipe
from ..messages import verdict as say
from ..messages.host import refusal
from ..model_shape import ModelShape
from ..recompute.ask import ActivationAsk, Choice, OffloadChoice
from ..recompute.choice import decide
from ..results.activations import Activations
from ..results.layout import Hardware, Layout
from ..results.plan import Plan
from ..speed import Mode
from .best import alternatives
from .chunks import chunks_to_try
from .modes import ALL_MODES, ModeChoice, modes_for
from .one_pass import Fit
from .pair_split import fitted
from .suggestions import suggestions as what_fits


def _host(
    shape: ModelShape,
    chosen: Recipe,
    layout: Layout,
    hardware: Hardware,
    *,
    limit: HostLimit | None,
    ask: ActivationAsk,
) -> HostNeed:
    """The pod's host memory, with the refusal where the GPUs fit but a node's host does not."""
    need = need_of(shape, chosen, layout.mode, hardware.gpus)
    if not layout.fits or limit is None or not refused(need, limit):
        return need
    return replace(need, refusal=refusal(need, limit, offloads=ask.offloads))


def _sized(
    shape: ModelShape, recipe: Recipe, hardware: Hardware, layout: Layout, *, fit: Fit, ask: ActivationAsk | None
) -> tuple[Layout, Recipe, Activations | None]:
    """The layout and recipe as planned: with the layers' activations decided where the layout fits
    and `ask` sizes them (None: the recipe's layers as they are)."""
    if not layout.fits or ask is None:
        return layout, replace(recipe, loss_chunk_tokens=layout.loss_chunk_tokens), None
    layout, activations = decide(shape, recipe, hardware, layout, chunks=fit.chunks, ask=ask, host_limit=fit.host_limit)
    return layout, activations.recipe, activations


def _as_asked(recipe: Recipe, ask: ActivationAsk | None, pair_split: Choice) -> Recipe:
    """The recipe the search starts from: planned all-recompute (auto) or as `ask` says (None:
    the recipe's layers as they are), the kept layers sized after; the recomputing layers' inputs
    in host memory where `inputs` asks it; the pairs split where `pair_split` is true."""
    if ask is not None:
        recipe = replace(recipe, gradient_checkpointing=ask.recomputes, kept_layers=0, offload=False)
        if ask.inputs and ask.recomputes:
            recipe = replace(recipe, offload_inputs=True)
    return pairs.split(recipe) if pair_split is True and pairs.splittable(recipe) else recipe


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
    offload: OffloadChoice = False,
    kept_layers: int | None = None,
    pair_split: Choice = "auto",
    host_limit: HostLimit | None = None,
) -> Plan:
    """Plan `shape` trained with `recipe` on `hardware`.

    `allowed_modes` limits `auto` to what the trainer implements; `loss_chunks` lists the loss
    chunk sizes to try in order (0 = whole-sequence logits); the default tries whole-sequence
    logits first, then chunks of LOSS_CHUNK_TOKENS, unless the recipe names a chunk size.
    `checkpointing` (`training.gradientCheckpointing`; None: the recipe's as it is) and `offload`
    (`training.activationOffload`) decide which layers keep, recompute or offload their
    activations (`recompute`); `auto` plans the mode all-recompute, then keeps what fits, or the
    `kept_layers` asked (`training.keptLayers`: refused, naming it, where they do not fit);
    `host_limit` (`resources.memory`, or what a node offers) bounds what offload may pin, and a
    pod above a node's offer does not fit. A micro-batch of rows of several sequences (preference
    pairs) that fits no way in one pass goes through one pass per sequence (`pair_split`), as
    `pair_split` (`training.pairSplit`) allows: true splits whatever fits, false never does.
    """
    if hardware.gpus < 1:
        raise ValueError("the planner needs at least one GPU")
    chunks = chunks_to_try(recipe, loss_chunks)
    # `checkpointing` None: the recipe's layers as they are, nothing sized.
    ask = ActivationAsk("auto" if checkpointing is None else checkpointing, offload, kept_layers)
    sizing = checkpointing is not None
    recipe = _as_asked(recipe, ask if sizing else None, pair_split)
    modes = modes_for(mode, hardware, allowed_modes)
    fit = Fit(modes, chunks, host_limit)
    unsplit, (recipe, layout, per_mode, inputs_refused) = fitted(
        shape, recipe, hardware, fit, holds=sizing and ask.may_offload, may_split=pair_split == "auto"
    )
    beside = alternatives(shape, recipe, hardware, layout, per_mode, mode=mode, modes=modes, chunks=chunks)
    layout, chosen, activations = _sized(shape, recipe, hardware, layout, fit=fit, ask=ask if sizing else None)
    speed = estimate(shape, chosen, hardware.product, gpus=hardware.gpus, mode=layout.mode, epoch_tokens=epoch_tokens)
    lines: list[str] = []
    if not layout.fits:
        lines = what_fits(shape, recipe, hardware, choice=mode, allowed=allowed_modes, chunks=chunks)
        lines = lines if inputs_refused is None else [inputs_refused, *lines]
        if pair_split is False and pairs.splittable(recipe):
            lines.append(say.PAIRS_UNSPLIT)
    message = say.verdict(layout, beside, hardware, lines) + say.decided(
        activations, chosen, layout, asked=pair_split is True
    )
    refused = None if activations is None else activations.refusal
    if refused is not None:
        lines, message = [refused], f"{refused} (the plan: {message})"
    host = _host(shape, chosen, layout, hardware, limit=host_limit, ask=ask)
    if host.refusal is not None:
        lines = [host.refusal]
        message = say.host_first(host.refusal, message)
    return Plan(
        fits=layout.fits and host.refusal is None and refused is None,
        mode=layout.mode,
        hardware=hardware,
        shape=shape,
        recipe=chosen,
        layout=layout,
        speed=speed,
        message=message,
        host=host,
        alternatives=beside,
        suggestions=tuple(lines),
        device_map=layout.placement.device_map() if layout.placement is not None and hardware.gpus > 1 else None,
        max_memory=loading_budget(shape, recipe, layout),
        activations=activations,
        host_limit=host_limit,
        unsplit=unsplit,
    )

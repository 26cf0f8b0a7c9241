"""The layers' activations for a plan that fits: which keep, recompute or offload, as the spec
asks (`ask`), and why, with the layout that decision leaves on the GPUs.

`gradientCheckpointing: false` keeps every layer; `true` recomputes every one, offloading them
where `activationOffload: true`; `auto` keeps as many as the margin allows (`kept`), or the
`keptLayers` the spec names (refused, naming the field, where the margin does not hold them), then
offloads the rest where asked, or where `auto` finds it pays (`offload`). Where the GPUs need
them there, or where `activationOffload: inputs` asks it, the recomputing layers' inputs wait in
host memory instead (the search decided that).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .. import memory as mem
from ..host.limit import HostLimit
from ..host.pinned import offload_host_bytes
from ..layouts.mode import layout_for
from ..memory import Recipe
from ..messages import activations as say
from ..model_shape import ModelShape
from ..results.activations import Activations
from ..results.layout import Hardware, Layout
from .ask import ActivationAsk
from .kept import sized, tokens_per_second
from .offload import offload_if_it_pays


def _every_layer_recomputes(
    shape: ModelShape, all_recompute: Recipe, hw: Hardware, layout: Layout, *, ask: ActivationAsk, baseline: float
) -> tuple[Layout, Activations]:
    """`gradientCheckpointing: true`: every layer recomputes, or offloads where that is asked."""
    wanted = ask.offloads
    chosen = replace(all_recompute, offload=wanted)
    if wanted:
        layout = layout_for(layout.mode, shape, chosen, hw)
    pinned = offload_host_bytes(shape, chosen)
    why = say.inputs_only(ask.offload) if mem.inputs_offloaded(chosen) else say.asked(ask.offload)
    return layout, Activations(chosen, say.layers_line(shape, chosen, pinned), why, baseline)


def _kept_as_asked(
    shape: ModelShape,
    all_recompute: Recipe,
    hw: Hardware,
    layout: Layout,
    *,
    chunks: Sequence[int],
    ask: ActivationAsk,
    baseline: float,
) -> tuple[Layout, Activations]:
    """`keptLayers`: that many layers keep their activations (all, where the model has fewer),
    where the planner's margin holds them; else the plan's refusal naming the field."""
    asked = min(ask.kept or 0, shape.layers)
    found = sized(
        shape, all_recompute, hw, layout.mode, chunks=[layout.loss_chunk_tokens, *chunks], offload=ask.offloads
    )
    most = None if found is None else found[1].kept_layers
    base = replace(all_recompute, offload=ask.offloads) if found is None else found[1]
    chosen = replace(base, kept_layers=asked)
    layout = layout_for(layout.mode, shape, chosen, hw)
    why = (
        say.ASKED_ON
        if ask.offloads
        else say.not_weighed(ask.offload, bool(mem.recomputed_layers(shape, chosen)), kept_asked=True)
    )
    if mem.inputs_offloaded(chosen) and mem.recomputed_layers(shape, chosen):
        why = say.inputs_only(ask.offload)
    line = say.layers_line(shape, chosen, offload_host_bytes(shape, chosen))
    refusal = None
    if most is None or asked > most:
        refusal = say.kept_refused(asked, most, f"{hw.gpus} x {hw.product.name}")
    rate = tokens_per_second(shape, chosen, hw, layout.mode)
    return layout, Activations(chosen, say.against_all_recompute(line, rate, baseline), why, baseline, refusal)


def decide(
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
    baseline = tokens_per_second(shape, all_recompute, hw, layout.mode)
    if not ask.recomputes:
        return layout, Activations(plain, say.layers_line(shape, plain, 0.0), say.NO_LAYER_RECOMPUTES)
    if ask.recomputes_all:
        return _every_layer_recomputes(shape, all_recompute, hw, layout, ask=ask, baseline=baseline)
    if ask.kept is not None:
        return _kept_as_asked(shape, all_recompute, hw, layout, chunks=chunks, ask=ask, baseline=baseline)
    wanted = ask.offloads
    found = sized(shape, all_recompute, hw, layout.mode, chunks=[layout.loss_chunk_tokens, *chunks], offload=wanted)
    if found is None:
        return layout, Activations(all_recompute, say.all_recompute(shape.layers), say.no_room(wanted), baseline)
    layout, chosen = found
    rate = tokens_per_second(shape, chosen, hw, layout.mode)
    if wanted:
        why = say.ASKED_ON
    elif ask.weighs_offload and (mem.recomputed_layers(shape, chosen) or chosen.loss_chunk_tokens):
        layout, chosen, why = offload_if_it_pays(
            shape,
            all_recompute,
            hw=hw,
            layout=layout,
            kept_only=chosen,
            rate=rate,
            host_limit=host_limit,
            chunks=list(dict.fromkeys([layout.loss_chunk_tokens, *chunks])),
        )
        rate = tokens_per_second(shape, chosen, hw, layout.mode)
    else:
        why = say.not_weighed(ask.offload, bool(mem.recomputed_layers(shape, chosen)))
    if mem.inputs_offloaded(chosen) and mem.recomputed_layers(shape, chosen):
        why = say.inputs_only(ask.offload)
    line = say.layers_line(shape, chosen, offload_host_bytes(shape, chosen))
    return layout, Activations(chosen, say.against_all_recompute(line, rate, baseline), why, baseline)

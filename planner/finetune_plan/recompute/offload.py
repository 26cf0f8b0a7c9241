"""`activationOffload: auto`: offload the layers not kept where the speed model says it pays, as
many as the pod's host memory holds.

Weighed where some layers still recompute, or where every layer keeps but only with the loss in
chunks (each chunk's logits are recomputed in the backward, and offloading some layers may leave
room for a whole loss). Each layer's copies cross the host link under the compute of its
neighbours (`speed.offload_stall_seconds`); the pinned memory is bounded by `host.budget`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .. import memory as mem
from ..host.budget import most_offloaded
from ..host.limit import HostLimit
from ..host.pinned import pinned_layer_bytes
from ..memory import Recipe
from ..messages import activations as say
from ..model_shape import ModelShape
from ..results.layout import Hardware, Layout
from .kept import sized, tokens_per_second


def _capped(
    shape: ModelShape,
    all_recompute: Recipe,
    alt: tuple[Layout, Recipe],
    *,
    hw: Hardware,
    chunks: Sequence[int],
    limit: HostLimit,
) -> tuple[tuple[Layout, Recipe] | None, str]:
    """The offloading sizing `alt` with no more layers offloaded than `limit` holds: it as it
    is, fewer layers (and the phrase that says why), or None with why not one layer fits."""
    layout, offloaded = alt
    most = most_offloaded(shape, offloaded, layout.mode, hw.gpus, limit)
    if most >= mem.offloaded_layers(shape, offloaded):
        return alt, ""
    if most < 1:
        return None, say.not_one_layer(pinned_layer_bytes(shape, offloaded), limit)
    fewer = replace(all_recompute, max_offloaded=most)
    resized = sized(shape, fewer, hw, layout.mode, chunks=chunks, offload=True)
    if resized is None:
        return None, say.AUTO_NO_ROOM
    return resized, say.capped(mem.offloaded_layers(shape, resized[1]), limit)


def offload_if_it_pays(
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
    offload the layers not kept instead when the plan says it is faster, with the loss chunk size
    (of `chunks`) that runs fastest. Only as many layers offload as their pinned memory fits the
    pod's host memory (`host_limit`), those just before the kept ones; the first ones recompute,
    or all when not one layer fits. Returns the layout, the recipe and why offload is on or off."""
    alt = sized(shape, all_recompute, hw, layout.mode, chunks=chunks, offload=True)
    if alt is None:
        return layout, kept_only, say.AUTO_NO_ROOM
    capped = ""
    if host_limit is not None:
        held, capped = _capped(shape, all_recompute, alt, hw=hw, chunks=chunks, limit=host_limit)
        if held is None:
            return layout, kept_only, capped
        alt = held
    alt_layout, offloaded = alt
    alt_rate = tokens_per_second(shape, offloaded, hw, alt_layout.mode)
    on = alt_rate > rate
    why = say.weighed(
        on, capped=capped, offloaded_rate=alt_rate, rate=rate, recomputing=bool(mem.recomputed_layers(shape, kept_only))
    )
    return (alt_layout, offloaded, why) if on else (layout, kept_only, why)

"""The plan's message: its one line on the GPUs, the decisions beside the mode, and the host's
verdict before both where the pod does not fit a node.

This is the line `ftjob plan` prints after FITS or DOES NOT FIT, what the trainer logs and what a
job that does not fit fails with (WontFit).
"""

from __future__ import annotations

from collections.abc import Sequence

from finetune_api.modes import to_spec

from .. import pairs
from ..memory import Recipe
from ..results.activations import Activations
from ..results.layout import Hardware, Layout
from .figures import gib

# Where one pass of a pair's sequences fits no way and the spec keeps them together.
PAIRS_UNSPLIT = "training.pairSplit: false keeps a pair's sequences in one pass; auto or true splits them"


def verdict(layout: Layout, alternatives: Sequence[Layout], hardware: Hardware, suggestions: list[str]) -> str:
    """The plan's one line on the GPUs: fits (peak, headroom) or not (shortfall, what to change),
    and what the other modes would need."""
    fullest = layout.fullest
    where = f"{hardware.gpus} x {hardware.product.name}"
    word = to_spec(layout.mode)
    if layout.fits:
        chunk = f", loss in chunks of {layout.loss_chunk_tokens} tokens" if layout.loss_chunk_tokens else ""
        message = (
            f"fits on {where} in {word} mode{chunk}: peak {gib(fullest.total)} on GPU {fullest.index} "
            f"of {hardware.memory_gib:.1f} GiB ({gib(fullest.headroom)} headroom)"
        )
    else:
        message = (
            f"does not fit on {where}: the closest is {word} mode, which needs {gib(fullest.total)} on "
            f"GPU {fullest.index}, {gib(layout.shortfall)} more than its {hardware.memory_gib:.1f} GiB; "
            + "; ".join(suggestions)
        )
    other_text = "; ".join(
        f"{to_spec(a.mode)} needs {gib(a.fullest.total)} on GPU {a.fullest.index}"
        + ("" if a.fits else " (does not fit)")
        for a in alternatives
        if a.mode != layout.mode
    )
    return message + (f" (also: {other_text})" if other_text else "")


def decided(activations: Activations | None, chosen: Recipe, layout: Layout, *, asked: bool = False) -> str:
    """The plan's decisions beyond the mode, for its message: the layers' activations, the pair
    split (`asked`: training.pairSplit: true)."""
    out = "" if activations is None else f"; {activations.checkpointing}; activation offload {activations.offload}"
    if chosen.pair_split and layout.fits:
        why = "training.pairSplit: true" if asked else "one micro-batch of both does not fit"
        out += f"; {pairs.describe(chosen)} ({why})"
    return out


def host_first(refusal: str, message: str) -> str:
    """A plan whose GPUs fit but whose pod is above a node's host memory: the host's refusal,
    then the GPUs' line."""
    return f"{refusal} (the GPUs: {message})"

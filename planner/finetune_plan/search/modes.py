"""The modes a plan weighs: the one a spec names, or under `auto` every mode the trainer runs.

Modes (all one pod; in the spec's words `deviceMap`, `dataParallel`, `fsdp`, see
finetune_api.modes; each laid out by `layouts`). `auto` picks the fastest mode that fits; on one
GPU every mode is the whole model on that GPU, and `auto` names it data_parallel (the
world-size-1 case): the first of the allowed modes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal, cast

from finetune_api.modes import MODES

from ..results.layout import Hardware
from ..speed import Mode

ModeChoice = Literal["auto", "device_map", "data_parallel", "fsdp"]
# Every mode the planner lays out, in the order of finetune_api.modes.MODES.
ALL_MODES: Final[tuple[Mode, ...]] = cast(tuple[Mode, ...], tuple(m.planner for m in MODES))


def modes_for(choice: ModeChoice, hw: Hardware, allowed: Sequence[Mode]) -> list[Mode]:
    """The modes to weigh: the one asked, or `auto`'s (one GPU: the first allowed)."""
    if choice != "auto":
        return [choice]
    modes = [m for m in ALL_MODES if m in allowed]
    return modes[:1] if hw.gpus == 1 else modes

"""How the planner's sentences write a figure of memory: GiB with one decimal."""

from __future__ import annotations

from ..memory import GIB


def gib(value: float) -> str:
    """`4.1 GiB` for `value` bytes."""
    return f"{value / GIB:.1f} GiB"

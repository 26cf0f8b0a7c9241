"""Bisection over a whole number where a test turns once and stays turned: how the planner finds
the most layers that keep their activations, the longest maxLength and the fewest GPUs that fit
without trying every one."""

from __future__ import annotations

from collections.abc import Callable


def largest_fitting(low: int, high: int, fits: Callable[[int], bool]) -> int | None:
    """The largest n in [low, high] with `fits(n)`, for a `fits` that turns false once and stays
    so; None when not even `low` fits."""
    if not fits(low):
        return None
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def smallest_fitting(low: int, high: int, fits: Callable[[int], bool]) -> int:
    """The smallest n in [low, high] with `fits(n)`, for a `fits` that turns true once and stays
    so, and holds at `high` (the caller has checked)."""
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return low

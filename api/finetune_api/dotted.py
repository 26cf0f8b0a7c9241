"""A spec (or any nested mapping) as dotted paths to its leaves, `training.learningRate`: the rows
`ftjob compare` lines up across jobs and report.html's settings table shows."""

from collections.abc import Mapping
from typing import Any


def dotted_paths(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as dotted paths to its leaves (a list, or an empty mapping, is one leaf)."""
    if not isinstance(value, Mapping) or not value:
        return {prefix: value} if prefix else {}
    rows: dict[str, Any] = {}
    for key, inner in value.items():
        rows.update(dotted_paths(inner, f"{prefix}.{key}" if prefix else str(key)))
    return rows

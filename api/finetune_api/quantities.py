"""Bytes in a Kubernetes quantity of the API's form (`QUANTITY_PATTERN`: a decimal number and an
optional SI or binary suffix), without the kubernetes client: the planner and the CLI need it too."""

import math
import re
from decimal import Decimal
from typing import Final

from .base import QUANTITY_PATTERN

_FACTORS: Final[dict[str, Decimal]] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate("kMGTPE")},
    **{s + "i": Decimal(1024) ** (i + 1) for i, s in enumerate("KMGTPE")},
}


def to_bytes(quantity: str) -> int:
    """Bytes in a memory or storage quantity, rounded up (a fractional byte is a whole one)."""
    text = quantity.strip()
    if not re.fullmatch(QUANTITY_PATTERN, text):
        raise ValueError(f"{quantity!r} is not a quantity such as 96Gi or 500M")
    number = re.match(r"[0-9]+(\.[0-9]+)?", text)
    assert number is not None
    return math.ceil(Decimal(number.group(0)) * _FACTORS[text[number.end() :]])


def describe_bytes(size: int) -> str:
    """Bytes as people read a download: decimal units, three figures (141 GB, 2.1 MB, 512 bytes)."""
    if size < 1000:
        return f"{size} bytes"
    value = float(size)
    for unit in ("kB", "MB", "GB", "TB", "PB"):
        value /= 1000
        if value < 1000 or unit == "PB":
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    raise AssertionError("unreachable")

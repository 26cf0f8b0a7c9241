"""Just enough Kubernetes quantity arithmetic to size a pod's volumes from its memory limit.

Quantities reaching here have passed QUANTITY_PATTERN (settings, the API models), so the
only suffixes are the binary and decimal ones that pattern allows.
"""

import math
import re
from decimal import Decimal

_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_FORM = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)$")
MI = 2**20


def to_bytes(quantity: str) -> int:
    """Bytes in a memory or storage quantity, rounded up (a fractional byte is a whole one)."""
    match = _FORM.match(quantity.strip())
    if not match or match.group(2) not in _SUFFIX:
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity")
    return math.ceil(Decimal(match.group(1)) * _SUFFIX[match.group(2)])


def mebibytes(count: int, *, round_up: bool) -> str:
    """A byte count as whole Mi: up for limits that must hold it, down for caps it must stay under."""
    whole = -(-count // MI) if round_up else count // MI
    return f"{whole}Mi"

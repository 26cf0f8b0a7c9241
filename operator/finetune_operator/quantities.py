"""Just enough Kubernetes quantity arithmetic to size a pod's volumes from its memory limit.

Parsing is the kubernetes client's own (`parse_quantity`, which raises ValueError on a bad
quantity); quantities reaching here have passed QUANTITY_PATTERN (settings, the API models).
"""

import math
from decimal import Decimal

from kubernetes.utils import parse_quantity

MI = 2**20


def to_bytes(quantity: str) -> int:
    """Bytes in a memory or storage quantity, rounded up (a fractional byte is a whole one)."""
    value: Decimal = parse_quantity(quantity.strip())  # type: ignore[no-untyped-call]
    return math.ceil(value)


def mebibytes(count: int, *, round_up: bool) -> str:
    """A byte count as whole Mi: up for limits that must hold it, down for caps it must stay under."""
    whole = -(-count // MI) if round_up else count // MI
    return f"{whole}Mi"

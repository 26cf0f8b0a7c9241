"""Just enough Kubernetes quantity arithmetic to size a pod's volumes from its memory limit.

Parsing is the API's (`finetune_api.quantities`); quantities reaching here have passed
QUANTITY_PATTERN (settings, the API models).
"""

from finetune_api.quantities import to_bytes

MI = 2**20

__all__ = ["MI", "mebibytes", "to_bytes"]


def mebibytes(count: int, *, round_up: bool) -> str:
    """A byte count as whole Mi: up for limits that must hold it, down for caps it must stay under."""
    whole = -(-count // MI) if round_up else count // MI
    return f"{whole}Mi"

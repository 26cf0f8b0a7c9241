"""The operator's part of the status and the merge patch that writes it.

The status has two writers: the operator (every field of the model but the trainer's) and the
trainer (`progress`, `lastCheckpoint`). A patch touches only the operator's fields, so neither
writer ever overwrites the other's.
"""

from collections.abc import Mapping
from typing import Any

from finetune_api.status import operator_fields

# The fields the operator owns (the status model's, less the trainer's); a status patch never
# touches any other.
OWNED_FIELDS = operator_fields()


def owned_part(status: Mapping[str, Any] | None) -> dict[str, Any]:
    status = status or {}
    return {k: status[k] for k in OWNED_FIELDS if status.get(k) is not None}


def needs_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    return owned_part(current) != owned_part(desired)


def status_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch of the owned fields only; fields that went away are set to null."""
    patch: dict[str, Any] = {k: v for k, v in owned_part(desired).items() if owned_part(current).get(k) != v}
    for key in OWNED_FIELDS:
        if current.get(key) is not None and desired.get(key) is None:
            patch[key] = None
    return patch

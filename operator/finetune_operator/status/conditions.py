"""One of the API's Conditions as the status writes it, and the order the status lists them in.

A condition's lastTransitionTime is the moment its status last flipped, kept from the status as
it is now: a reconcile that says the same thing again moves nothing.
"""

from typing import Any, Literal, get_args

from finetune_api.status import Condition, ConditionType

from .observation import Observation

# Conditions in the order the API lists their types.
CONDITION_ORDER: tuple[str, ...] = get_args(ConditionType)
# The conditions being computed, by type.
Conditions = dict[str, dict[str, Any]]


def condition(kind: ConditionType, ok: bool | None, reason: str, message: str, obs: Observation) -> dict[str, Any]:
    """One of the API's Conditions, as on the wire (built unvalidated: the CRD bounds it)."""
    status: Literal["True", "False", "Unknown"] = "Unknown" if ok is None else "True" if ok else "False"
    previous = next((c for c in obs.current.get("conditions") or [] if c.get("type") == kind), None)
    # lastTransitionTime moves only when the status flips.
    since = previous.get("lastTransitionTime") if previous and previous.get("status") == status else obs.now
    made = Condition.model_construct(
        type=kind,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=obs.generation,
    )
    return made.model_dump(by_alias=True)


def ordered(conds: Conditions) -> list[dict[str, Any]]:
    """The API's types in its order, then any other the status already had."""
    return [conds[k] for k in CONDITION_ORDER if k in conds] + [c for k, c in conds.items() if k not in CONDITION_ORDER]

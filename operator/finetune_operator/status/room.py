"""Whether a node of the job's product can ever hold its pods (finetune_plan.nodes), and why the
Job has no pod at all (the Job controller's FailedCreate: a ResourceQuota's refusal), as the status
says them.

A job no node can hold gets Schedulable=False, its reason the verdict's (NoNodeOfProduct,
TooManyGpusPerNode, TooFewNodes, TooLittleHostMemory) and its message the line that says why and
what would run (the same GPUs as more pods of fewer GPUs, another product); the status message
says it and one Warning Event does (events.py). The job still waits: nodes may be added, an
autoscaler may bring larger ones, and the pending timeout (guardrails) is the platform's to set.
Once nodes that hold it appear, Schedulable=True (NodesFit). A job never warned has no such
condition: a job that fits says nothing it need not.
"""

from typing import Final

from .conditions import Conditions, condition
from .observation import Observation

SCHEDULABLE: Final = "Schedulable"
# The Job exists but the Job controller cannot create its pod (Scheduled=False with this reason).
FAILED_CREATE: Final = "FailedCreate"


def room_condition(obs: Observation, conds: Conditions) -> str | None:
    """The Schedulable condition from the nodes' verdict; the status message while no node can
    ever hold the job's pods, else None."""
    room = obs.room
    if room is None:
        return None
    if not room.fits:
        conds[SCHEDULABLE] = condition(SCHEDULABLE, False, room.reason, room.message, obs)
        return f"{room.reason}: {room.message}"
    if conds.get(SCHEDULABLE, {}).get("status") == "False":
        conds[SCHEDULABLE] = condition(SCHEDULABLE, True, room.reason, room.message, obs)
    return None


def create_refusal(refusal: str) -> tuple[bool, str, str]:
    """The Scheduled verdict of a Job whose pod cannot be created, in the Job controller's words."""
    return False, FAILED_CREATE, f"the Job cannot create its pod: {refusal}"

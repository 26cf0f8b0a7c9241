"""What one reconcile saw of a job, and the reasons the operator gives a job it refuses.

The refusals are decided before any Job exists (decide.py), each ending the job Failed with its
reason; the trainer's own reasons are finetune_api.reasons.ExitReason.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from finetune_api.reasons import ExitReason
from finetune_plan.nodes import Room

from ..workloads import Admission

# A spec the models or the API server refuse.
INVALID = "Invalid"
# An image outside the platform's allow-list (images.py).
IMAGE_NOT_ALLOWED = "ImageNotAllowed"
# A FineTuneJob in a namespace the operator never writes in (Settings.excluded_namespaces).
NAMESPACE_NOT_ALLOWED = "NamespaceNotAllowed"
WONT_FIT = ExitReason.WontFit.name  # the trainer's reason, here decided before any pod: host memory
# A job above the platform's limits per job (guardrails.py).
EXCEEDS_LIMIT = "ExceedsLimit"
# Failures decided before any Job exists.
REFUSALS = frozenset({NAMESPACE_NOT_ALLOWED, IMAGE_NOT_ALLOWED, WONT_FIT, EXCEEDS_LIMIT})
# A job whose pre-flight Job checks its inputs (preflight.py): Pending, saying so.
CHECKING_INPUTS = "CheckingInputs"
# A job whose trainer calls a Service of its namespace that is not there yet, or not reachable by
# a NetworkPolicy (builders/network.py): Pending, saying which, with a Warning.
SERVICE_MISSING = "ServiceMissing"


@dataclass(frozen=True)
class Observation:
    """Everything one reconcile saw, as plain API dicts (camelCase, as on the wire)."""

    generation: int
    now: str
    current: Mapping[str, Any]
    invalid: str | None = None
    invalid_reason: str = INVALID
    job: Mapping[str, Any] | None = None
    pods: Sequence[Mapping[str, Any]] = ()
    output: Mapping[str, Any] | None = None
    suspend_requested: bool = False
    queued: bool = False
    queue_name: str | None = None
    # Kueue's Workload of the Job, read (workloads.py); None before Kueue made one.
    admission: Admission | None = None
    # The preempting FineTuneJob (namespace/name), when the preemptor's Job is one of ours.
    preemptor: str | None = None
    # spec.resources.nodes: the pods of one attempt (an Indexed Job when more than one).
    nodes: int = 1
    # What the pre-flight Job is doing while it checks the inputs, before the Job exists, or what
    # else the job waits for then (`checking_reason`: SERVICE_MISSING).
    checking: str | None = None
    checking_reason: str = CHECKING_INPUTS
    # Whether a node of the product can ever hold the job's pods (finetune_plan.nodes.room);
    # None where it was not judged (a CPU job, a running one, nodes not known).
    room: Room | None = None
    # Why the Job controller cannot create the Job's pod (its FailedCreate Event), while it has none.
    refusal: str | None = None
    # The S3 sources as the fetch Job left them (status.inputs), when its pod is seen.
    inputs: Sequence[Mapping[str, Any]] | None = None

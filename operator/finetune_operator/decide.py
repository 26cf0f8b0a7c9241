"""What one reconcile of one FineTuneJob should do, decided from what it saw: no I/O, no clock.

The applier (reconcile.py) gathers an `Observed` (the job, its Job and pods, Kueue's Workloads,
the time), calls `decide`, and carries out the `Actions`. An action that changes what `decide`
would see (a create that met a Job already there, a child the API server refused, a Job
patched) is followed by another `decide` on the new facts, in the same reconcile.

Level-based: the answer depends on the cluster as it is, never on what changed, so deciding
again after a missed event, a crash or a restart converges to the same place.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from finetune_api import images
from finetune_api.contract import TERMINAL_PHASES
from finetune_api.problems import problems_from
from finetune_api.spec import FineTuneJobSpec
from finetune_plan.pod import memory_refusal, pod_plan

from . import guardrails, preflight, workloads
from .builders import job as job_builder
from .builders import multinode, network, rbac, serving
from .builders import preflight as preflight_builder
from .builders import pvc as pvc_builder
from .children import Owner
from .settings import Settings
from .status import (
    EXCEEDS_LIMIT,
    IMAGE_NOT_ALLOWED,
    INVALID,
    NAMESPACE_NOT_ALLOWED,
    REFUSALS,
    WONT_FIT,
    Observation,
    Transition,
    compute,
    hand_over,
    needs_patch,
    status_patch,
)

Body = dict[str, Any]


@dataclass(frozen=True)
class Observed:
    """One job as a reconcile found it, as plain API dicts (camelCase, as on the wire)."""

    namespace: str
    name: str
    settings: Settings
    now: str
    body: Body | None  # the FineTuneJob; None: it is gone
    job: Body | None = None  # the Job of the job's name, whoever owns it
    preflight: Body | None = None  # the pre-flight Job (builders/preflight.py), whoever owns it
    pods: Sequence[Body] = ()  # the pods labelled with the job's name (the Job's and the pre-flight's)
    workloads: Sequence[Body] = ()  # Kueue's Workloads of Jobs of that name
    # The "namespace/name" of our FineTuneJob behind each Job UID a Workload names as preemptor.
    preemptors: Mapping[str, str] = field(default_factory=dict)
    # The API server refused a child just now, saying this.
    rejected: str | None = None
    # Nodes by their value of the GPU product label, listed when a pending timeout needs it
    # (`nodes_listed`); None after a listing the API server refused.
    nodes_listed: bool = False
    node_values: Mapping[str, int] | None = None


@dataclass(frozen=True)
class Actions:
    """What to do, in this order: forget, create, patch the Job; else write status and Events."""

    forget: bool = False  # the FineTuneJob is gone
    create: tuple[Body, ...] = ()  # children in creation order, the Job last
    # The pre-flight Job to create before the GPU Job's children, after the job's NetworkPolicy
    # if it has one (its pod is the job's pod as far as the policies go: no pod of a job runs
    # unfenced; the namespace's policies come before either, identity.py).
    preflight: tuple[Body, ...] = ()
    job_patch: Body | None = None  # fields of the live Job to change
    status_patch: Body | None = None  # a merge patch of the operator's status fields
    events: tuple[Transition, ...] = ()  # after the status patch: Warnings only (status.transitions)
    phase: str | None = None
    list_nodes: bool = False  # list the nodes and decide again (guardrails.unschedulable_message)
    hand_over: bool = False  # the status written would be a hand-over (status.hand_over): it may wait longer

    @property
    def writes(self) -> bool:
        """Whether carrying these out writes status and Events (paced during a burst); Events
        come only with a status change."""
        return self.status_patch is not None


def _inputs(
    seen: Observed, owner: Owner, spec: FineTuneJobSpec, current: Body
) -> tuple[Actions | None, preflight.Verdict | None]:
    """(what to do first, or the pre-flight's verdict) for a job without its Job yet: create the
    pre-flight Job, wait for it (checking), then the GPU Job (passed), or fail (failed). None,
    None: no pre-flight (nothing on a claim, or the platform switched it off)."""
    if not preflight_builder.needed(spec, seen.settings):
        return None, None
    check = seen.preflight if seen.preflight is not None and owned_by(seen.preflight, owner.uid) else None
    phase = current.get("phase")
    if check is None and phase in TERMINAL_PHASES:
        return None, None  # the verdict is written, and nothing more is made
    if check is None and seen.preflight is not None:
        # A deleted job's of the same name, still being collected: its deletion queues us again.
        return Actions(phase=phase), None
    if check is None:
        check_job = preflight_builder.preflight_job(owner, spec, seen.settings)
        return Actions(preflight=(*network_children(owner, spec, seen.settings), check_job), phase=phase), None
    uid = (check.get("metadata") or {}).get("uid")
    return None, preflight.verdict(seen.name, spec, check, [p for p in seen.pods if owned_by(p, uid)])


def parse_spec(body: Body) -> tuple[FineTuneJobSpec | None, str | None]:
    try:
        return FineTuneJobSpec.model_validate(body.get("spec") or {}), None
    except ValidationError as exc:
        return None, "; ".join(str(p) for p in problems_from(exc, FineTuneJobSpec, prefix="spec"))


def image_refusal(spec: FineTuneJobSpec, settings: Settings) -> str | None:
    """Why the job's trainer image may not run here, or None when the allow-list permits it."""
    image = spec.image or settings.trainer_image
    if images.allowed(image, settings.allowed_images):
        return None
    return images.refusal(image, settings.allowed_images)


def desired_children(owner: Owner, spec: FineTuneJobSpec, settings: Settings) -> list[Body]:
    """A job's own children in creation order: the Job last, so it never exists without its claim
    (and, for several nodes, without the headless Service its pods find each other through), and
    its NetworkPolicy (several nodes only) first, so that no trainer pod of it ever runs unfenced;
    the namespace's policies are made before any of them (`namespace_children`).

    The trainer's config rides in the Job's pod template and its identity is the namespace's
    (identity.py): a job whose output claim the user brings costs one create, its Job.
    """
    claim = pvc_builder.output_pvc(owner, spec)
    service = multinode.service(owner, spec) if spec.resources.multinode else None
    return [
        *network_children(owner, spec, settings),
        *([claim] if claim is not None else []),
        *([service] if service is not None else []),
        multinode.indexed_job(owner, spec, settings),
    ]


def network_children(owner: Owner, spec: FineTuneJobSpec, settings: Settings) -> list[Body]:
    """The job's own NetworkPolicy: only a job of several nodes has one (its peers' ports), and
    none where the platform switched trainer policies off. The rest of what a trainer may reach
    is the namespace's (`namespace_children`)."""
    rules = settings.trainer_network
    policy = network.job_policy(owner, spec, rules) if rules is not None else None
    return [policy] if policy is not None else []


def namespace_children(namespace: str, settings: Settings) -> list[Body]:
    """What every job of a namespace shares, made before its first Job: the trainer identity
    (builders/rbac.py) and, where the platform turned them on, the trainers' NetworkPolicies."""
    rules = settings.trainer_network
    return [*rbac.identity(namespace), *(network.namespace_policies(namespace, rules) if rules is not None else [])]


def output_status(owner: Owner, spec: FineTuneJobSpec) -> dict[str, Any]:
    return serving.output_status(owner.name, spec, pvc_builder.output_claim_name(owner, spec))


def job_patch(job: Body, spec: FineTuneJobSpec, settings: Settings) -> Body:
    """Fields of the live Job that differ from what the FineTuneJob asks for now."""
    live = job.get("spec") or {}
    patch: Body = {}
    if spec.suspend and not live.get("suspend"):
        patch["suspend"] = True
    # A queued Job is unsuspended by Kueue, not by us.
    if not spec.suspend and live.get("suspend") and spec.placement.queue_name is None:
        patch["suspend"] = False
    for key, value in job_builder.mutable_fields(spec, settings).items():
        if live.get(key) != value:
            patch[key] = value
    return patch


def owned_by(child: Body, uid: str | None) -> bool:
    refs = (child.get("metadata") or {}).get("ownerReferences") or []
    return uid is not None and any(r.get("uid") == uid for r in refs)


def namespace_refusal(namespace: str, settings: Settings) -> str | None:
    """Why the operator makes nothing in this namespace (the fence refuses its children there too)."""
    if namespace not in settings.excluded_namespaces:
        return None
    return (
        f"namespace {namespace!r} is one the operator never writes in "
        f"({', '.join(settings.excluded_namespaces)}); create the FineTuneJob in a team namespace"
    )


def _refused(spec: FineTuneJobSpec, current: Body, seen: Observed) -> tuple[str, str] | None:
    """(message, reason) of a refusal decided before any Job exists: a namespace the operator
    never writes in, an image outside the allow-list, or `resources.memory` below what the pod's
    plan needs. Checked before the first Job, and again for as long as the job stays Failed for
    one of them (a job that ran is never failed by a narrower list)."""
    conditions = current.get("conditions") or []
    failed_for_it = any(c.get("type") == "Failed" and c.get("reason") in REFUSALS for c in conditions)
    if current.get("phase") in TERMINAL_PHASES and not failed_for_it:
        return None
    settings = seen.settings
    if (namespace := namespace_refusal(seen.namespace, settings)) is not None:
        return namespace, NAMESPACE_NOT_ALLOWED
    image = image_refusal(spec, settings)
    if image is not None:
        return image, IMAGE_NOT_ALLOWED
    if (limit := guardrails.limit_refusal(spec, settings)) is not None:
        return limit, EXCEEDS_LIMIT
    per_gpu = settings.host_memory_for(spec.resources.gpu_product)
    memory = memory_refusal(spec, pod_plan(spec, host_memory_per_gpu=per_gpu).host)
    return (memory, WONT_FIT) if memory is not None else None


def _unschedulable(
    seen: Observed, spec: FineTuneJobSpec, current: Body, job: Body, pods: list[Body]
) -> tuple[Actions | None, str | None]:
    """(what to do first, or the message of the Unschedulable failure) past the pending timeout.
    The failure stands once written: the Job is suspended, so its pods are gone and cannot be
    placed later behind the user's back."""
    said = next(
        (
            c.get("message")
            for c in current.get("conditions") or []
            if c.get("type") == "Failed" and c.get("reason") == guardrails.UNSCHEDULABLE
        ),
        None,
    )
    message = str(said) if said else None
    # A queued job is Kueue's: it admits only onto a flavor's nodes (waitForPodsReady bounds the
    # rest), and it would unsuspend a Job it admitted as soon as we suspended it.
    queued = spec.placement.queue_name is not None
    if message is None and not queued and guardrails.pending_too_long(pods, seen.now, seen.settings):
        if not seen.nodes_listed:
            return Actions(list_nodes=True, phase=current.get("phase")), None
        message = guardrails.unschedulable_message(spec, pods, seen.node_values, seen.settings)
    if message is not None and not (job.get("spec") or {}).get("suspend"):
        return Actions(job_patch={"suspend": True}, phase=current.get("phase")), None
    return None, message


def _admission(
    seen: Observed, spec: FineTuneJobSpec | None, job: Body | None
) -> tuple[workloads.Admission | None, str | None]:
    """Kueue's verdict on the Job's Workload, and the preempting FineTuneJob when it is ours."""
    if spec is None or not spec.placement.queue_name or job is None:
        return None, None
    workload = workloads.of_job(seen.workloads, job)
    if workload is None:
        return None, None
    admission = workloads.read(workload)
    uid = admission.preemption.preemptor_job_uid if admission.preemption else None
    return admission, seen.preemptors.get(uid) if uid else None


def _with_spec(observed: Observation, owner: Owner, spec: FineTuneJobSpec | None) -> Observation:
    """What the status reads of the spec (none for a spec that did not parse)."""
    if spec is None:
        return observed
    return replace(
        observed,
        output=output_status(owner, spec),
        suspend_requested=bool(spec.suspend),
        queued=bool(spec.placement.queue_name),
        queue_name=spec.placement.queue_name,
        nodes=spec.resources.nodes,
    )


def decide(seen: Observed) -> Actions:
    body = seen.body
    if body is None:
        return Actions(forget=True)
    meta = body["metadata"]
    if meta.get("deletionTimestamp"):
        return Actions()  # the garbage collector deletes the children (owner references)
    current: Body = body.get("status") or {}
    owner = Owner(name=seen.name, namespace=seen.namespace, uid=meta["uid"])
    spec, invalid = parse_spec(body)
    invalid_reason = INVALID
    job: Body | None = None
    pods: list[Body] = []
    checking: str | None = None
    if spec is not None:
        # A Job that another owner holds is a deleted FineTuneJob's of the same name, still
        # being collected: not ours, and nothing is created until the name is free.
        job = seen.job if seen.job is not None and owned_by(seen.job, owner.uid) else None
        if seen.rejected is not None:
            # Admission let the spec through but refused a child (e.g. a malformed affinity): a
            # spec problem, reported once as Failed, not a retry loop.
            invalid = seen.rejected
        elif seen.job is None and (refused := _refused(spec, current, seen)) is not None:
            # Decided before any child exists: the job ends Failed and no Job is ever made.
            invalid, invalid_reason = refused
        elif seen.job is None:
            first, check = _inputs(seen, owner, spec, current)
            if first is not None:
                return first
            if check is not None and check.state == "failed":
                # Before any GPU Job: the job ends Failed, naming the claim and the path in it.
                invalid, invalid_reason = check.message, check.reason
            elif check is not None and check.state == "checking":
                checking = check.message
            elif current.get("phase") not in TERMINAL_PHASES:
                # The pass that creates a Job writes nothing else: its status follows in the next
                # pass, paced while Jobs are being created (runtime/pacing.py).
                children = tuple(desired_children(owner, spec, seen.settings))
                return Actions(create=children, phase=current.get("phase"))
        if job is not None:
            uid = (job.get("metadata") or {}).get("uid")
            pods = [p for p in seen.pods if owned_by(p, uid)]
            first, stuck = _unschedulable(seen, spec, current, job, pods)
            if first is not None:
                return first
            if stuck is not None:
                invalid, invalid_reason = stuck, guardrails.UNSCHEDULABLE
            elif patch := job_patch(job, spec, seen.settings):
                return Actions(job_patch=patch, phase=current.get("phase"))
    admission, preemptor = _admission(seen, spec, job)
    observed = Observation(
        generation=int(meta.get("generation") or 0),
        now=seen.now,
        current=current,
        invalid=invalid,
        invalid_reason=invalid_reason,
        job=job,
        pods=pods,
        checking=checking,
        admission=admission,
        preemptor=preemptor,
    )
    outcome = compute(_with_spec(observed, owner, spec))
    if not needs_patch(current, outcome.status):
        return Actions(phase=outcome.phase)
    return Actions(
        status_patch=status_patch(current, outcome.status),
        events=tuple(outcome.transitions),
        phase=outcome.phase,
        hand_over=hand_over(outcome.status),
    )

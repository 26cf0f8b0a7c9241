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
from finetune_api.contract import TERMINAL_PHASES, uses_objects
from finetune_api.objectives import services_of
from finetune_api.problems import problems_from
from finetune_api.quantities import to_bytes
from finetune_api.services import outside
from finetune_api.spec import FineTuneJobSpec
from finetune_plan.nodes import NodeFacts, Nodes, Room
from finetune_plan.pod import Verdict, pod_plan, verdict

from . import fetch_stage, guardrails, preflight, workloads
from .builders import job as job_builder
from .builders import multinode, network, rbac, serving
from .builders import preflight as preflight_builder
from .builders import pvc as pvc_builder
from .children import Owner, owned_by
from .runtime.cache import Refusal
from .settings import Settings
from .status.events import Transition
from .status.observation import (
    CHECKING_INPUTS,
    EXCEEDS_LIMIT,
    IMAGE_NOT_ALLOWED,
    INVALID,
    NAMESPACE_NOT_ALLOWED,
    REFUSALS,
    SERVICE_MISSING,
    WONT_FIT,
    Observation,
)
from .status.patch import needs_patch, status_patch
from .status.phase import compute, hand_over
from .status.room import SCHEDULABLE

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
    fetch: Body | None = None  # the fetch Job of S3 objects (builders/objects.py), whoever owns it
    # The object cache claim, read when a fetch is to be made (`claim_read`); None: there is none.
    claim_read: bool = False
    cache_claim: Body | None = None
    pods: Sequence[Body] = ()  # the pods labelled with the job's name (the Job's and the pre-flight's)
    workloads: Sequence[Body] = ()  # Kueue's Workloads of Jobs of that name
    # The "namespace/name" of our FineTuneJob behind each Job UID a Workload names as preemptor.
    preemptors: Mapping[str, str] = field(default_factory=dict)
    # The API server refused a child just now, saying this.
    rejected: str | None = None
    # The GPU nodes (those with the product label), from the watch cache; None where they are
    # not known (before their first list, or where the operator may not read Nodes).
    nodes: tuple[NodeFacts, ...] | None = None
    # The Job controller's last refusal to create a pod, by the UID of the Job it refused (the
    # job's Job or its pre-flight Job): a ResourceQuota's words.
    refusals: Mapping[str, Refusal] = field(default_factory=dict)
    # The Services the job's trainer calls (its objective's `services`), read by name when the
    # Job is to be made (`services_read`); None: there is none of that name.
    services_read: bool = False
    services: Mapping[str, Body | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Actions:
    """What to do, in this order: forget, create, patch the Job; else write status and Events."""

    forget: bool = False  # the FineTuneJob is gone
    create: tuple[Body, ...] = ()  # children in creation order, the Job last
    # The pre-flight Job to create before the GPU Job's children, after the job's NetworkPolicy
    # if it has one (its pod is the job's pod as far as the policies go: no pod of a job runs
    # unfenced; the namespace's policies come before either, identity.py).
    preflight: tuple[Body, ...] = ()
    # The fetch Job (after the namespace's object cache claim, when it is made now).
    fetch: tuple[Body, ...] = ()
    read_claim: str | None = None  # read this object cache claim and decide again
    read_services: tuple[str, ...] = ()  # read these Services of the namespace and decide again
    job_patch: Body | None = None  # fields of the live Job to change
    status_patch: Body | None = None  # a merge patch of the operator's status fields
    events: tuple[Transition, ...] = ()  # after the status patch: Warnings only (status.events.transitions)
    phase: str | None = None
    hand_over: bool = False  # the status written would be a hand-over (status.phase.hand_over): it may wait longer

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
    own = [p for p in seen.pods if owned_by(p, uid)]
    said = preflight.verdict(seen.name, spec, check, own, refusal=refusal_of(seen, check, own))
    if said.state == "passed" and uses_objects(spec):
        step = fetch_stage.fetch(seen, owner, spec, phase, said.message)
        if step.wait or step.read_claim or step.create:
            return Actions(read_claim=step.read_claim, fetch=step.create, phase=phase), None
        return None, step.verdict
    return None, said


def refusal_of(seen: Observed, job: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The Job controller's words on why it cannot create a pod of `job`, while no pod of it was
    made since (a pod newer than the refusal means the quota let it through after all)."""
    uid = ((job or {}).get("metadata") or {}).get("uid")
    refused = seen.refusals.get(uid) if uid else None
    if refused is None:
        return None
    newest = max((str((p.get("metadata") or {}).get("creationTimestamp") or "") for p in pods), default="")
    return refused.message if newest < refused.time else None


def parse_spec(body: Body) -> tuple[FineTuneJobSpec | None, str | None]:
    try:
        return FineTuneJobSpec.model_validate(body.get("spec") or {}), None
    except ValidationError as exc:
        return None, "; ".join(str(p) for p in problems_from(exc, FineTuneJobSpec, prefix="spec"))


def parse_job(body: Body, namespace: str) -> tuple[FineTuneJobSpec | None, str | None]:
    """`parse_spec`, and what the spec may not ask in `namespace`, which admission cannot see:
    a Service of another namespace for its trainer to call."""
    spec, invalid = parse_spec(body)
    refusal = outside(services_of(spec.training), namespace) if spec is not None else None
    return (None, refusal) if refusal is not None else (spec, invalid)


def image_refusal(spec: FineTuneJobSpec, settings: Settings) -> str | None:
    """Why the job's trainer image may not run here, or None when the allow-list permits it."""
    image = spec.image or settings.trainer_image
    if images.allowed(image, settings.allowed_images):
        return None
    return images.refusal(image, settings.allowed_images)


def desired_children(
    owner: Owner, spec: FineTuneJobSpec, settings: Settings, services: Mapping[str, Body | None] | None = None
) -> list[Body]:
    """A job's own children in creation order: the Job last, so it never exists without its claim
    (and, for several nodes, without the headless Service its pods find each other through), and
    its NetworkPolicies (several nodes; Services its trainer calls, as read: `services`) first,
    so that no trainer pod of it ever runs unfenced or unable to reach what it calls;
    the namespace's policies are made before any of them (`namespace_children`).

    The trainer's config rides in the Job's pod template and its identity is the namespace's
    (identity.py): a job whose output claim the user brings costs one create, its Job.
    """
    claim = pvc_builder.output_pvc(owner, spec)
    service = multinode.service(owner, spec) if spec.resources.multinode else None
    return [
        *network_children(owner, spec, settings, services),
        *([claim] if claim is not None else []),
        *([service] if service is not None else []),
        multinode.indexed_job(owner, spec, settings),
    ]


def network_children(
    owner: Owner, spec: FineTuneJobSpec, settings: Settings, services: Mapping[str, Body | None] | None = None
) -> list[Body]:
    """The job's own NetworkPolicies: a job of several nodes has one (its peers' ports), a job
    whose trainer calls Services another (their pods, from the Services as read: `services`; the
    pre-flight's pod calls none, so it is made with the Job), and none where the platform
    switched trainer policies off. The rest of what a trainer may reach is the namespace's
    (`namespace_children`)."""
    rules = settings.trainer_network
    if rules is None:
        return []
    egress = network.service_egress(services_of(spec.training), services, fenced=True)[0] if services else []
    made = (network.job_policy(owner, spec, rules), network.services_policy(owner, egress))
    return [policy for policy in made if policy is not None]


def services_step(seen: Observed, spec: FineTuneJobSpec) -> tuple[tuple[str, ...], str | None]:
    """(the Services to read first, what the job waits for) before its Job is made: the Services
    its trainer calls, read once per pass, each there (and where the trainers are fenced,
    reachable by a NetworkPolicy: builders/network.py)."""
    calls = services_of(spec.training)
    if calls and not seen.services_read:
        return tuple(dict.fromkeys(call.service for call in calls)), None
    fenced = seen.settings.trainer_network is not None
    return (), network.service_egress(calls, seen.services, fenced)[1]


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


def namespace_refusal(namespace: str, settings: Settings) -> str | None:
    """Why the operator makes nothing in this namespace (the fence refuses its children there too)."""
    if namespace not in settings.excluded_namespaces:
        return None
    return (
        f"namespace {namespace!r} is one the operator never writes in "
        f"({', '.join(settings.excluded_namespaces)}); create the FineTuneJob in a team namespace"
    )


def nodes_of(seen: Observed) -> Nodes | None:
    """The GPU nodes as the planner's verdict reads them, where the watch cache knows them."""
    if seen.nodes is None:
        return None
    return Nodes(seen.nodes, "the cluster's nodes", label=seen.settings.gpu_product_label)


def judge(spec: FineTuneJobSpec, seen: Observed) -> Verdict:
    """The verdict `ftjob plan` gives on the same spec (finetune_plan.pod.verdict): the pod's plan
    where the model is known by name, its memory limit as the Job will set it, and the nodes."""
    settings = seen.settings
    planned = pod_plan(spec, host_memory_per_gpu=settings.host_memory_for(spec.resources.gpu_product))
    memory = job_builder.memory_limit(spec, settings, planned.host)
    plan = planned.launch.plan if planned.launch is not None else None
    return verdict(spec, plan, nodes_of(seen), to_bytes(memory) if memory else None)


def _refused(spec: FineTuneJobSpec, current: Body, seen: Observed) -> tuple[str, str] | None:
    """(message, reason) of a refusal decided before any Job exists: a namespace the operator
    never writes in, an image outside the allow-list, a job above the platform's limits, or one
    that cannot fit its GPUs or its host memory (`judge`: WontFit, as `ftjob plan` refuses it).
    Checked before the first Job, and again for as long as the job stays Failed for one of them
    (a job that ran is never failed by a narrower list). The nodes' verdict is no refusal: nodes
    may yet be added, so it is a warning the job waits under (`room_of`)."""
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
    said = judge(spec, seen)
    return (said.message, WONT_FIT) if said.reason == WONT_FIT else None


# Phases in which no pod of the job runs yet: whether any node can ever hold one is worth saying.
WAITING_PHASES = frozenset({None, "Pending", "Queued", "Admitted"})


def room_of(spec: FineTuneJobSpec, current: Mapping[str, Any], seen: Observed) -> Room | None:
    """The nodes' verdict on a GPU job still waiting for its pods, or one that was warned (its
    Schedulable condition False) until the warning is lifted; None where there is nothing to say."""
    warned = any(c.get("type") == SCHEDULABLE and c.get("status") == "False" for c in current.get("conditions") or [])
    if spec.resources.gpus < 1 or seen.nodes is None:
        return None
    if current.get("phase") not in WAITING_PHASES and not warned:
        return None
    return judge(spec, seen).room


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
        message = guardrails.unschedulable_message(spec, pods, seen.nodes, seen.settings)
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


def _with_spec(observed: Observation, owner: Owner, spec: FineTuneJobSpec | None, seen: Observed) -> Observation:
    """What the status reads of the spec (none for a spec that did not parse): the output, the
    suspend and queue asks, the nodes' verdict on a job that waits, why its Job has no pod."""
    if spec is None:
        return observed
    return replace(
        observed,
        output=output_status(owner, spec),
        suspend_requested=bool(spec.suspend),
        queued=bool(spec.placement.queue_name),
        queue_name=spec.placement.queue_name,
        nodes=spec.resources.nodes,
        room=room_of(spec, observed.current, seen) if observed.invalid is None else None,
        refusal=refusal_of(seen, observed.job, observed.pods) if observed.job is not None else None,
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
    spec, invalid = parse_job(body, seen.namespace)
    invalid_reason = INVALID
    job: Body | None = None
    pods: list[Body] = []
    checking: str | None = None
    waits_for = CHECKING_INPUTS
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
                read, waiting = services_step(seen, spec)
                if read:
                    return Actions(read_services=read, phase=current.get("phase"))
                if waiting is None:
                    # The pass that creates a Job writes nothing else: its status follows in the
                    # next pass, paced while Jobs are being created (runtime/pacing.py).
                    children = tuple(desired_children(owner, spec, seen.settings, seen.services))
                    return Actions(create=children, phase=current.get("phase"))
                # Pending, saying which Service; the resync looks again (settings.resync_seconds).
                checking, waits_for = waiting, SERVICE_MISSING
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
        inputs=fetch_stage.inputs_of(seen.pods),
        generation=int(meta.get("generation") or 0),
        now=seen.now,
        current=current,
        invalid=invalid,
        invalid_reason=invalid_reason,
        job=job,
        pods=pods,
        checking=checking,
        checking_reason=waits_for,
        admission=admission,
        preemptor=preemptor,
    )
    outcome = compute(_with_spec(observed, owner, spec, seen))
    if not needs_patch(current, outcome.status):
        return Actions(phase=outcome.phase)
    return Actions(
        status_patch=status_patch(current, outcome.status),
        events=tuple(outcome.transitions),
        phase=outcome.phase,
        hand_over=hand_over(outcome.status),
    )

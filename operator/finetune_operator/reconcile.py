"""One reconcile of one FineTuneJob: read, create what is missing, compute status, patch once.

Level-based: it looks at the cluster as it is, not at what changed, so running it again (after
a missed event, a crash or a restart) is always safe and always converges. "As it is" comes
from the watch cache where it can (see cache.py) and from the API server where the cache has
not seen an object yet.
"""

import datetime
import logging
import threading
import time
from collections.abc import Hashable
from typing import Any, cast

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from finetune_api.problems import problems_from
from finetune_api.spec import FineTuneJobSpec

from . import images, metrics, workloads
from .builders import job as job_builder
from .builders import paths
from .builders import pvc as pvc_builder
from .cache import WatchCache
from .children import Owner
from .crash_hook import maybe_crash
from .identity import TrainerIdentities
from .kube import Body, ChildRejected, Kube, describe_error
from .pacing import WritePacer
from .settings import Settings
from .status import IMAGE_NOT_ALLOWED, INVALID, TERMINAL, Observation, compute, needs_patch, status_patch
from .workqueue import NEW, UPDATE, WorkQueue

logger = logging.getLogger(__name__)

# What a reconcile meets when the API server is away or busy: retried, never a crash.
TRANSIENT = (ApiException, urllib3.exceptions.HTTPError, OSError)
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_spec(body: Body) -> tuple[FineTuneJobSpec | None, str | None]:
    """The validated spec, or one line per problem (admission normally catches these first)."""
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
    """A job's own children in creation order: the Job last, so it never exists without its claim.

    The trainer's config rides in the Job's pod template and its identity is the namespace's
    (identity.py): a job whose output claim the user brings costs one create, its Job.
    """
    children: list[Body] = []
    claim = pvc_builder.output_pvc(owner, spec)
    if claim is not None:
        children.append(claim)
    children.append(job_builder.job(owner, spec, settings))
    return children


def output_status(owner: Owner, spec: FineTuneJobSpec) -> dict[str, Any]:
    out: dict[str, Any] = {
        "claimName": pvc_builder.output_claim_name(owner, spec),
        "adapterPath": paths.adapter_path(owner.name, spec),
    }
    merged = paths.merged_path(owner.name, spec)
    if merged:
        out["mergedPath"] = merged
    return out


def job_patch(job: Body, spec: FineTuneJobSpec) -> Body:
    """Fields of the live Job that differ from what the FineTuneJob asks for now."""
    live = job.get("spec") or {}
    patch: Body = {}
    if spec.suspend and not live.get("suspend"):
        patch["suspend"] = True
    # A queued Job is unsuspended by Kueue, not by us.
    if not spec.suspend and live.get("suspend") and spec.placement.queue_name is None:
        patch["suspend"] = False
    for key, value in job_builder.mutable_fields(spec).items():
        if live.get(key) != value:
            patch[key] = value
    return patch


Key = tuple[str, str]


class Reconciler:
    def __init__(self, kube: Kube, settings: Settings, cache: WatchCache | None = None, workers: int = 16) -> None:
        self.kube = kube
        self.settings = settings
        self.cache = cache or WatchCache()
        self.identities = TrainerIdentities(self._create_identity)
        self._retry_guard = threading.Lock()
        self._failures: dict[Key, int] = {}
        self._retry_pending: set[Key] = set()
        # Jobs whose Job this process created and whose JobCreated Event is not written yet:
        # the creating pass writes nothing but the Job (pacing.py), the next one says so.
        self._unannounced: set[Key] = set()
        # Reconciles wait on the API server, not the CPU: enough threads to keep many jobs moving.
        self.queue = WorkQueue(self._work, workers)
        self.pacer = WritePacer(lambda key: self.queue.add(key, UPDATE))
        metrics.QUEUE_DEPTH.set_function(self.queue.depth)
        metrics.WRITES_PARKED.set_function(self.pacer.parked)

    def forget(self, namespace: str, name: str) -> None:
        with self._retry_guard:
            self._failures.pop((namespace, name), None)
            self._unannounced.discard((namespace, name))
        self.pacer.forget((namespace, name))
        self.cache.forget(namespace, name)
        metrics.PHASE_BOOK.set(namespace, name, None)

    def reconcile(self, namespace: str, name: str) -> str | None:
        """Bring one job's children and status in line with what the cluster shows; the phase."""
        # One job is reconciled by one thread at a time: the work queue hands out each key once.
        started = time.monotonic()
        try:
            return self._reconcile(namespace, name)
        finally:
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)

    def enqueue(self, namespace: str, name: str, priority: int = UPDATE) -> None:
        """Reconcile soon, on a worker; NEW (no Job yet) goes before UPDATE."""
        self.queue.add((namespace, name), priority)

    def needs_job(self, namespace: str, name: str, body: Body) -> bool:
        """Whether this event's job is still waiting for its Job: the urgent kind of work."""
        return not (body.get("status") or {}).get("phase") and self.cache.job(namespace, name) is None

    def _work(self, key: Hashable) -> None:
        namespace, name = cast(Key, key)
        self.trigger(namespace, name)

    def trigger(self, namespace: str, name: str) -> None:
        """Reconcile now on this thread (the work queue's workers call this).

        A failed API call is retried with exponential backoff (0.5 s doubling to 30 s), not left
        to the next event or resync: after an API server outage every job converges as soon
        as the server answers. Other exceptions are bugs and propagate.
        """
        key = (namespace, name)
        with self._retry_guard:
            self._retry_pending.discard(key)  # whatever retry was due, this reconcile is it
        try:
            self.reconcile(namespace, name)
        except TRANSIENT as exc:
            self._retry_later(key, exc)
        else:
            with self._retry_guard:
                self._failures.pop(key, None)

    def _retry_later(self, key: Key, exc: BaseException) -> None:
        with self._retry_guard:
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
            if key in self._retry_pending:
                return
            self._retry_pending.add(key)
        metrics.RECONCILE_RETRIES.inc()
        delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (failures - 1))
        logger.warning(
            "%s/%s: reconcile failed (%d in a row), retrying in %.1f s: %s",
            *key,
            failures,
            delay,
            describe_error(exc),
        )

        self.queue.add_after(key, delay, NEW if self.cache.job(*key) is None else UPDATE)

    def _finetunejob(self, namespace: str, name: str) -> Body | None:
        body = self.cache.finetunejob(namespace, name)
        if body is None:
            body = self.kube.get_finetunejob(namespace, name)
            if body is not None:
                self.cache.put_finetunejob(body)
        return body

    def _job_and_pods(self, namespace: str, name: str, current: Body) -> tuple[Body | None, list[Body] | None]:
        """The Job and its pods (None: not read yet), from the cache, else from the API server."""
        job = self.cache.job(namespace, name)
        if job is not None:
            return job, self.cache.pods(namespace, name)
        if not current:
            # Never reconciled: there is no Job yet, and creating it answers with the one
            # there is if an earlier run of this reconcile got that far.
            return None, None
        job = self.kube.get_job(namespace, name)
        if job is None:
            return None, None
        self.cache.put_job(job)
        return job, self._list_pods(namespace, name)

    def _list_pods(self, namespace: str, name: str) -> list[Body]:
        pods = self.kube.list_pods(namespace, name)
        for pod in pods:
            self.cache.put_pod(name, pod)
        return pods

    def _reconcile(self, namespace: str, name: str) -> str | None:
        body = self._finetunejob(namespace, name)
        if body is None:
            self.forget(namespace, name)
            return None
        meta = body["metadata"]
        if meta.get("deletionTimestamp"):
            return None
        current: Body = body.get("status") or {}
        owner = Owner(name=name, namespace=namespace, uid=meta["uid"])
        spec, invalid = parse_spec(body)
        invalid_reason = INVALID
        job: Body | None = None
        pods: list[Body] = []
        if spec is not None:
            job, seen_pods = self._job_and_pods(namespace, name, current)
            if job is not None and not self._owned(job, owner):
                # A Job of a deleted FineTuneJob of the same name, still being collected.
                job = None
            elif job is None and (refused := self._image_refused(spec, current)) is not None:
                # Decided before any child exists: the job ends Failed and no Job is ever made.
                invalid, invalid_reason = refused, IMAGE_NOT_ALLOWED
            elif job is None and current.get("phase") not in TERMINAL:
                try:
                    job, created = self._create_children(body, owner, spec)
                    if created:
                        # The pass that creates a Job writes nothing else: its status and
                        # Event follow in the next pass, paced while Jobs are being created.
                        self.cache.put_job(job)
                        self.pacer.created()
                        with self._retry_guard:
                            self._unannounced.add((namespace, name))
                        self.enqueue(namespace, name, UPDATE)
                        return current.get("phase")
                except ChildRejected as exc:
                    # Admission let the spec through but a child is refused (e.g. a malformed
                    # affinity): that is a spec problem, reported once as Failed, not a retry loop.
                    invalid = str(exc)
                if job is not None and not self._owned(job, owner):
                    job = None  # the name is still held by the old job's Job: next event
            if job is not None:
                self.cache.put_job(job)
                patch = job_patch(job, spec)
                if patch:
                    job = self.kube.patch_job(namespace, name, {"spec": patch})
                    self.cache.put_job(job)
                if seen_pods is None:
                    seen_pods = self._list_pods(namespace, name)
                pods = [p for p in seen_pods if self._owned_by_job(p, job)]
        admission, preemptor = self._admission(namespace, name, spec, job)
        outcome = compute(
            Observation(
                generation=int(meta.get("generation") or 0),
                now=_now(),
                current=current,
                invalid=invalid,
                invalid_reason=invalid_reason,
                job=job,
                pods=pods,
                output=output_status(owner, spec) if spec is not None else None,
                suspend_requested=bool(spec and spec.suspend),
                queued=bool(spec and spec.placement.queue_name),
                queue_name=spec.placement.queue_name if spec is not None else None,
                admission=admission,
                preemptor=preemptor,
            )
        )
        with self._retry_guard:
            announce = (namespace, name) in self._unannounced
        patch_needed = needs_patch(current, outcome.status)
        if (patch_needed or announce) and not self.pacer.may_write((namespace, name)):
            return current.get("phase")  # parked: the pacer hands the job back when its turn comes
        if announce:
            if job is not None:
                self.kube.post_event(body, "Normal", "JobCreated", f"created Job {job['metadata']['name']}")
            with self._retry_guard:
                self._unannounced.discard((namespace, name))
        if patch_needed:
            self.cache.put_finetunejob(self.kube.patch_status(namespace, name, status_patch(current, outcome.status)))
            for t in outcome.transitions:
                if announce and t.reason == "Pending" and not current.get("phase"):
                    continue  # "JobCreated" has said it, one Event per job is enough
                self.kube.post_event(body, t.type, t.reason, t.message)
            if outcome.phase != current.get("phase"):
                logger.info("%s/%s: phase %s -> %s", namespace, name, current.get("phase"), outcome.phase)
        metrics.PHASE_BOOK.set(namespace, name, outcome.phase)
        return outcome.phase

    def _admission(
        self, namespace: str, name: str, spec: FineTuneJobSpec | None, job: Body | None
    ) -> tuple[workloads.Admission | None, str | None]:
        """Kueue's verdict on the Job's Workload, and the preempting FineTuneJob when it is ours."""
        if spec is None or not spec.placement.queue_name or job is None:
            return None, None
        workload = workloads.of_job(self.cache.workloads(namespace, name), job)
        if workload is None:
            return None, None
        admission = workloads.read(workload)
        uid = admission.preemption.preemptor_job_uid if admission.preemption else None
        found = self.cache.job_key_by_uid(uid) if uid else None
        return admission, "/".join(found) if found else None

    def _image_refused(self, spec: FineTuneJobSpec, current: Body) -> str | None:
        """The allow-list's verdict for a job that has no Job: before its first one, and again
        for as long as the job stays Failed for it (a job that ran is never failed afterwards
        by a narrower list)."""
        failed_for_image = any(
            c.get("type") == "Failed" and c.get("reason") == IMAGE_NOT_ALLOWED for c in current.get("conditions") or []
        )
        if current.get("phase") in TERMINAL and not failed_for_image:
            return None
        return image_refusal(spec, self.settings)

    def _create_children(self, body: Body, owner: Owner, spec: FineTuneJobSpec) -> tuple[Body, bool]:
        """The Job, after the identity it runs as and the claim it mounts; (Job, created now)."""
        self.identities.ensure(owner.namespace)
        *claims, job_child = desired_children(owner, spec, self.settings)
        where = f"{owner.namespace}/{owner.name}"
        for claim in claims:
            self._create_one(where, claim)
        return self._create_one(where, job_child)

    def _create_identity(self, child: Body) -> None:
        self._create_one(f"{child['metadata']['namespace']} (trainer identity)", child)

    def _create_one(self, where: str, child: Body) -> tuple[Body, bool]:
        obj, created = self.kube.create_or_get(child)
        kind = child["kind"]
        if created:
            metrics.CHILDREN_CREATED.labels(kind=kind).inc()
            logger.info("%s: created %s %s", where, kind, child["metadata"]["name"])
            maybe_crash(self.settings, kind)
        return obj, created

    @staticmethod
    def _owned(child: Body, owner: Owner) -> bool:
        refs = (child.get("metadata") or {}).get("ownerReferences") or []
        return any(r.get("uid") == owner.uid for r in refs)

    @staticmethod
    def _owned_by_job(pod: Body, job: Body) -> bool:
        uid = (job.get("metadata") or {}).get("uid")
        refs = (pod.get("metadata") or {}).get("ownerReferences") or []
        return any(r.get("uid") == uid for r in refs)

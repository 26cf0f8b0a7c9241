"""One reconcile of one FineTuneJob: read, create what is missing, compute status, patch once.

Level-based: it looks at the cluster as it is, not at what changed, so running it again (after
a missed event, a crash or a restart) is always safe and always converges.
"""

import datetime
import logging
import threading
import time
from typing import Any

from pydantic import ValidationError

from finetune_api.problems import problems_from
from finetune_api.spec import FineTuneJobSpec

from . import metrics
from .builders import config as config_builder
from .builders import job as job_builder
from .builders import paths
from .builders import pvc as pvc_builder
from .builders import rbac as rbac_builder
from .children import Owner
from .coalesce import Coalescer
from .crash_hook import maybe_crash
from .kube import Body, ChildRejected, Kube
from .settings import Settings
from .status import TERMINAL, Observation, compute, needs_patch, status_patch

logger = logging.getLogger(__name__)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_spec(body: Body) -> tuple[FineTuneJobSpec | None, str | None]:
    """The validated spec, or one line per problem (admission normally catches these first)."""
    try:
        return FineTuneJobSpec.model_validate(body.get("spec") or {}), None
    except ValidationError as exc:
        return None, "; ".join(str(p) for p in problems_from(exc, FineTuneJobSpec, prefix="spec"))


def desired_children(owner: Owner, spec: FineTuneJobSpec, settings: Settings) -> list[Body]:
    """In creation order: the Job last, so a Job never exists without what it mounts and uses."""
    children: list[Body] = []
    claim = pvc_builder.output_pvc(owner, spec)
    if claim is not None:
        children.append(claim)
    children += [
        config_builder.config_map(owner, spec),
        rbac_builder.service_account(owner),
        rbac_builder.role(owner),
        rbac_builder.role_binding(owner),
        job_builder.job(owner, spec, settings),
    ]
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


class Reconciler:
    def __init__(self, kube: Kube, settings: Settings) -> None:
        self.kube = kube
        self.settings = settings
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._coalescer = Coalescer()

    def _lock(self, namespace: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        with self._locks_guard:
            self._locks.pop((namespace, name), None)
        metrics.PHASE_BOOK.set(namespace, name, None)

    def reconcile(self, namespace: str, name: str) -> str | None:
        """Bring one job's children and status in line with what the cluster shows; the phase."""
        started = time.monotonic()
        # Child events, the FineTuneJob's own events and the resync loop all land here, from
        # several threads; one job is reconciled by one of them at a time.
        with self._lock(namespace, name):
            try:
                return self._reconcile(namespace, name)
            finally:
                metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)

    def trigger(self, namespace: str, name: str) -> None:
        """Reconcile soon: now, or as a re-run of the reconcile of this job already in progress."""
        self._coalescer.run((namespace, name), lambda: self.reconcile(namespace, name))

    def _reconcile(self, namespace: str, name: str) -> str | None:
        body = self.kube.get_finetunejob(namespace, name)
        if body is None:
            self.forget(namespace, name)
            return None
        meta = body["metadata"]
        if meta.get("deletionTimestamp"):
            return None
        current: Body = body.get("status") or {}
        owner = Owner(name=name, namespace=namespace, uid=meta["uid"])
        spec, invalid = parse_spec(body)
        job: Body | None = None
        pods: list[Body] = []
        if spec is not None:
            job = self.kube.get_job(namespace, name)
            if job is not None and not self._owned(job, owner):
                # A Job of a deleted FineTuneJob of the same name, still being collected.
                job = None
            elif job is None and current.get("phase") not in TERMINAL:
                try:
                    job = self._create_children(body, owner, spec)
                except ChildRejected as exc:
                    # Admission let the spec through but a child is refused (e.g. a malformed
                    # affinity): that is a spec problem, reported once as Failed, not a retry loop.
                    invalid = str(exc)
            if job is not None:
                patch = job_patch(job, spec)
                if patch:
                    job = self.kube.patch_job(namespace, name, {"spec": patch})
                pods = [p for p in self.kube.list_pods(namespace, name) if self._owned_by_job(p, job)]
        outcome = compute(
            Observation(
                generation=int(meta.get("generation") or 0),
                now=_now(),
                current=current,
                invalid=invalid,
                job=job,
                pods=pods,
                output=output_status(owner, spec) if spec is not None else None,
                suspend_requested=bool(spec and spec.suspend),
                queued=bool(spec and spec.placement.queue_name),
            )
        )
        if needs_patch(current, outcome.status):
            self.kube.patch_status(namespace, name, status_patch(current, outcome.status))
            for t in outcome.transitions:
                self.kube.post_event(body, t.type, t.reason, t.message)
            if outcome.phase != current.get("phase"):
                logger.info("%s/%s: phase %s -> %s", namespace, name, current.get("phase"), outcome.phase)
        metrics.PHASE_BOOK.set(namespace, name, outcome.phase)
        return outcome.phase

    def _create_children(self, body: Body, owner: Owner, spec: FineTuneJobSpec) -> Body | None:
        job: Body | None = None
        for child in desired_children(owner, spec, self.settings):
            obj, created = self.kube.create_or_get(child)
            kind = child["kind"]
            if created:
                metrics.CHILDREN_CREATED.labels(kind=kind).inc()
                logger.info("%s/%s: created %s %s", owner.namespace, owner.name, kind, child["metadata"]["name"])
                maybe_crash(self.settings, kind)
            if kind == "Job":
                job = obj
                if created:
                    self.kube.post_event(body, "Normal", "JobCreated", f"created Job {child['metadata']['name']}")
        return job

    @staticmethod
    def _owned(child: Body, owner: Owner) -> bool:
        refs = (child.get("metadata") or {}).get("ownerReferences") or []
        return any(r.get("uid") == owner.uid for r in refs)

    @staticmethod
    def _owned_by_job(pod: Body, job: Body) -> bool:
        uid = (job.get("metadata") or {}).get("uid")
        refs = (pod.get("metadata") or {}).get("ownerReferences") or []
        return any(r.get("uid") == uid for r in refs)

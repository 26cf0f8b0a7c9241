"""The applier: one reconcile of one job is observe, `decide` (decide.py), carry out.

It reads from the watch cache (the API server only on a miss), and writes with the kube client,
the work queue and the write pacer it is handed. What to do is decide.py's alone; how, and in
which order against the API server, is here. A failed API call is the queue's to retry.
"""

import dataclasses
import json
import logging
import time
from collections.abc import Hashable
from typing import Final, cast

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from finetune_api import contract

from . import workloads
from .crash_hook import maybe_crash
from .decide import Actions, Observed, decide, namespace_children
from .identity import TrainerIdentities
from .kube import Body, ChildRejected, Kube, describe_error
from .metrics import Metrics
from .runtime.cache import WatchCache
from .runtime.coalesce import StatusCoalescer
from .runtime.pacing import WritePacer
from .runtime.workqueue import NEW, UPDATE, WorkQueue
from .settings import Settings

logger = logging.getLogger(__name__)

# What a reconcile meets when the API server is away or busy: retried, never a crash.
TRANSIENT = (ApiException, urllib3.exceptions.HTTPError, OSError)
# Create, then patch the Job, then write: no reconcile needs more decisions.
MAX_DECISIONS = 4
# The children a decision may ask created, in the order they are tried: (the field of what was
# seen that holds it, the field of the actions that asks for it).
CHILDREN: Final = (("job", "create"), ("preflight", "preflight"), ("fetch", "fetch"))

Key = tuple[str, str]


class Reconciler:
    def __init__(
        self,
        *,
        kube: Kube,
        settings: Settings,
        cache: WatchCache,
        queue: WorkQueue,
        pacer: WritePacer,
        metrics: Metrics,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.cache = cache
        self.queue = queue
        self.pacer = pacer
        self.metrics = metrics
        self.identities = TrainerIdentities(
            self._create_identity, children=lambda namespace: namespace_children(namespace, settings)
        )
        # Status changes short of the end wait until they have stood (runtime/coalesce.py).
        self.coalescer = StatusCoalescer(settings.status_coalesce_seconds)

    def work(self, key: Hashable) -> None:
        """The work queue's work: reconcile, and on a failed API call have the queue retry."""
        namespace, name = cast(Key, key)
        started = time.monotonic()
        try:
            self.reconcile(namespace, name)
        except TRANSIENT as exc:
            priority = UPDATE if self.cache.has_job(namespace, name) else NEW
            failures, delay = self.queue.add_rate_limited(key, priority)
            self.metrics.reconcile_retries.inc()
            logger.warning(
                "%s/%s: reconcile failed (%d in a row), retrying in %.1f s: %s",
                namespace,
                name,
                failures,
                delay,
                describe_error(exc),
            )
        else:
            self.queue.forget(key)
        finally:
            self.metrics.reconcile_seconds.observe(time.monotonic() - started)

    def enqueue(self, namespace: str, name: str, priority: int = UPDATE) -> None:
        """Reconcile soon, on a worker; NEW (no Job yet) goes before UPDATE."""
        self.queue.add((namespace, name), priority)

    def needs_job(self, namespace: str, name: str, body: Body) -> bool:
        """Whether this event's job is still waiting for its Job: the urgent kind of work."""
        return not (body.get("status") or {}).get("phase") and not self.cache.has_job(namespace, name)

    def forget(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        self.queue.forget(key)
        self.pacer.forget(key)
        self.coalescer.drop(key)
        self.cache.forget(namespace, name)
        self.metrics.phases.set(namespace, name, None)

    # --- observe ------------------------------------------------------------------------------

    def observe(self, namespace: str, name: str) -> Observed:
        body = self.cache.finetunejob(namespace, name)
        if body is None:
            body = self.kube.get_finetunejob(namespace, name)
            if body is not None:
                self.cache.put_finetunejob(body)
        job = self.cache.job(namespace, name)
        # The pre-flight Job matters only until the Job exists (decide._inputs).
        check_name = contract.preflight_job_name(name)
        check = self.cache.job(namespace, check_name) if job is None else None
        fetch = self.cache.job(namespace, contract.fetch_job_name(name)) if check is not None else None
        pods = self.cache.pods(namespace, name) if job is not None or check is not None else []
        status = (body or {}).get("status") or {}
        if job is None and status and status.get("phase") not in contract.TERMINAL_PHASES:
            # Reconciled before, yet no Job in the cache: the watch may not have caught up. (A
            # job never reconciled has none; creating it answers with the one there is.)
            job = self.kube.get_job(namespace, name)
            if job is None and check is None:
                check = self.kube.get_job(namespace, check_name)
                if check is not None:
                    self.cache.put_job(check)
            if job is None and check is not None and fetch is None:
                fetch = self.kube.get_job(namespace, contract.fetch_job_name(name))
                if fetch is not None:
                    self.cache.put_job(fetch)
            if job is not None:
                self.cache.put_job(job)
            if job is not None or check is not None:
                pods = self._list_pods(namespace, name)
        found = self.cache.workloads(namespace, name) if job is not None else []
        refusals = {r.uid: r for r in (self.cache.refusal(job), self.cache.refusal(check)) if r is not None}
        return Observed(
            namespace=namespace,
            name=name,
            settings=self.settings,
            now=contract.now(),
            body=body,
            job=job,
            preflight=check,
            fetch=fetch,
            pods=pods,
            workloads=found,
            preemptors=self._preemptors(found),
            nodes=self.cache.nodes(),
            refusals=refusals,
        )

    def _preemptors(self, found: list[Body]) -> dict[str, str]:
        out: dict[str, str] = {}
        for workload in found:
            preemption = workloads.read(workload).preemption
            uid = preemption.preemptor_job_uid if preemption else None
            key = self.cache.job_key_by_uid(uid) if uid else None
            if uid and key:
                out[uid] = "/".join(key)
        return out

    def _list_pods(self, namespace: str, name: str) -> list[Body]:
        pods = self.kube.list_pods(namespace, name)
        for pod in pods:
            self.cache.put_pod(name, pod)
        return pods

    # --- carry out ----------------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str) -> str | None:
        """Bring one job's children and status in line with what the cluster shows; the phase."""
        # One job is reconciled by one thread at a time: the work queue hands out each key once.
        seen = self.observe(namespace, name)
        for _ in range(MAX_DECISIONS):
            actions = decide(seen)
            if actions.forget:
                self.forget(namespace, name)
                return None
            # The Job, the pre-flight check and the fetch: each created (its status follows in the
            # next pass) or, where it stood already, read into what was seen before deciding again.
            child = next(((field, made) for field, made in CHILDREN if getattr(actions, made)), None)
            if child is not None:
                field, made = child
                try:
                    built, created = self._create_children(namespace, name, getattr(actions, made))
                except ChildRejected as exc:
                    seen = dataclasses.replace(seen, rejected=str(exc))
                    continue
                self.cache.put_job(built)
                if created:
                    self.pacer.created()
                    self.enqueue(namespace, name, UPDATE)
                    return actions.phase
                pods = self._list_pods(namespace, name)
                # `field` is one of Observed's child fields (CHILDREN), each a Job object
                seen = dataclasses.replace(seen, pods=pods, **{field: built})  # type: ignore[arg-type]
                continue
            if actions.read_claim:
                claim = self.kube.get_claim(namespace, actions.read_claim)
                seen = dataclasses.replace(seen, claim_read=True, cache_claim=claim)
                continue
            if actions.read_services:
                found = {service: self.kube.get_service(namespace, service) for service in actions.read_services}
                seen = dataclasses.replace(seen, services_read=True, services=found)
                continue
            if actions.job_patch:
                job = self.kube.patch_job(namespace, name, {"spec": actions.job_patch})
                self.cache.put_job(job)
                seen = dataclasses.replace(seen, job=job)
                continue
            assert seen.body is not None
            return self._write(seen.body, actions, running=seen.job is not None)
        logger.error("%s/%s: no decision settled after %d tries", namespace, name, MAX_DECISIONS)
        return None

    def _write(self, body: Body, actions: Actions, *, running: bool) -> str | None:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        before = (body.get("status") or {}).get("phase")
        if not actions.writes:
            self.coalescer.drop((namespace, name))
        elif running and self._held((namespace, name), actions):
            return str(before) if before else None  # the queue hands the job back when the window closes
        if actions.writes and not self.pacer.may_write((namespace, name)):
            return str(before) if before else None  # parked: the pacer hands the job back in its turn
        if actions.status_patch is not None:
            try:
                updated = self.kube.patch_status(namespace, name, actions.status_patch)
            except ApiException as exc:
                if exc.status == 404:  # deleted while the watch was away: nothing to say
                    self.forget(namespace, name)
                    return None
                raise
            self.cache.put_finetunejob(updated)
            for event in actions.events:
                self.kube.post_event(body, event.type, event.reason, event.message)
            if actions.phase != before:
                logger.info("%s/%s: phase %s -> %s", namespace, name, before, actions.phase)
        self.metrics.phases.set(namespace, name, actions.phase)
        return actions.phase

    def _held(self, key: Key, actions: Actions) -> bool:
        """Whether this write waits (runtime/coalesce.py): a status short of the end of a job
        whose Job exists, until what the user would read has stood for the window (a hand-over,
        the trainer's exit before the Job's verdict, for the longest wait). Succeeded and Failed
        go at once, and so does whatever comes before the Job (the input check, a refusal).
        So does a change that posts an Event (`written_at_once`)."""
        if written_at_once(actions):
            self.coalescer.drop(key)
            return False
        hold, wake_in = self.coalescer.hold(key, _shown(actions), patient=actions.hand_over)
        if wake_in is not None:
            self.queue.add_after(key, wake_in)
        return hold

    def _create_children(self, namespace: str, name: str, children: tuple[Body, ...]) -> tuple[Body, bool]:
        """The Job, after what the namespace's jobs share (the identity it runs as, the trainers'
        NetworkPolicies), its own NetworkPolicy and claim; (Job, created now)."""
        self.identities.ensure(namespace)
        *before, job_child = children
        where = f"{namespace}/{name}"
        for child in before:
            self._create_one(where, child)
        return self._create_one(where, job_child)

    def _create_identity(self, child: Body) -> None:
        self._create_one(f"{child['metadata']['namespace']} (shared by its jobs)", child)

    def _create_one(self, where: str, child: Body) -> tuple[Body, bool]:
        obj, created = self.kube.create_or_get(child)
        kind = child["kind"]
        if created:
            self.metrics.children_created.labels(kind=kind).inc()
            logger.info("%s: created %s %s", where, kind, child["metadata"]["name"])
            maybe_crash(self.settings, kind)
        return obj, created


def written_at_once(actions: Actions) -> bool:
    """Whether a status change is written without waiting for it to stand: the end of a job,
    and a change that posts an Event (a restart, the GPU-memory retry, a preemption): trouble,
    rare, and its count may rest on a fact that passes. Kueue's Preempted condition is True only
    until the Workload is admitted again; a preemption held past that was never counted nor said
    (a gang preempted for 2 s ended Succeeded with no preemption in its status)."""
    return actions.phase in contract.TERMINAL_PHASES or bool(actions.events)


def _shown(actions: Actions) -> str:
    """What a write would show the user, less the moment it is made (a condition's
    lastTransitionTime is the pass's own clock until it is written)."""

    def strip(value: object) -> object:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "lastTransitionTime"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    said = [(e.type, e.reason, e.message) for e in actions.events]
    return json.dumps([strip(actions.status_patch), said], sort_keys=True, default=str)

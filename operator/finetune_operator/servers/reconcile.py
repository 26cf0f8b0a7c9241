"""The applier of ModelServers: observe, `decide` (decide.py), carry out, on a queue of their own.

A cluster holds a few servers (one per model a team serves), not the thousands of jobs the
FineTuneJob side is built for: a reconcile reads the server, its Deployment, its pods, the jobs
and claims it names straight from the API server (no cache), and is queued by any event of
them (handlers.py: the server's from kopf, its Deployment's and pods' from the streams, any job's
of its namespace). A failed API call is the queue's to retry, as for jobs.
"""

import dataclasses
import logging
from collections.abc import Hashable
from typing import cast

from finetune_api import contract
from finetune_api.constants import LABEL_SERVER
from finetune_api.served_files import named_jobs

from ..builders.model_server import ServerOwner
from ..kube import Body, ChildRejected, Kube, describe_error
from ..reconcile import TRANSIENT
from ..runtime.workqueue import UPDATE, WorkQueue
from ..settings import Settings
from .decide import ServerObserved, decide, parse

logger = logging.getLogger(__name__)
# Create, apply, then write: no reconcile needs more decisions.
MAX_DECISIONS = 4
WORKERS = 2

Key = tuple[str, str]


class ServerReconciler:
    def __init__(self, kube: Kube, settings: Settings) -> None:
        self.kube = kube
        self.settings = settings
        self.queue = WorkQueue(self.work, WORKERS, name="servers")
        # The servers seen per namespace: a job's event there queues them (its phase may free one).
        self.known: dict[str, set[str]] = {}

    def enqueue(self, namespace: str, name: str) -> None:
        self.queue.add((namespace, name), UPDATE)

    def seen(self, namespace: str, name: str, present: bool) -> None:
        names = self.known.setdefault(namespace, set())
        if present:
            names.add(name)
        else:
            names.discard(name)

    def keys(self) -> list[Key]:
        return [(namespace, name) for namespace, names in list(self.known.items()) for name in sorted(names)]

    def job_changed(self, namespace: str) -> None:
        for name in sorted(self.known.get(namespace, ())):
            self.enqueue(namespace, name)

    def work(self, key: Hashable) -> None:
        namespace, name = cast(Key, key)
        try:
            self.reconcile(namespace, name)
        except TRANSIENT as exc:
            failures, delay = self.queue.add_rate_limited(key, UPDATE)
            logger.warning(
                "modelserver %s/%s: reconcile failed (%d in a row), retrying in %.1f s: %s",
                namespace,
                name,
                failures,
                delay,
                describe_error(exc),
            )
        else:
            self.queue.forget(key)

    def observe(self, namespace: str, name: str) -> ServerObserved:
        body = self.kube.get_server(namespace, name)
        base = ServerObserved(namespace, name, self.settings, contract.now(), body)
        spec = parse(body)[0] if body is not None else None
        if body is None or spec is None:
            return base
        jobs = {job: self.kube.get_finetunejob(namespace, job) for job in named_jobs(spec)}
        claims = {s.pvc.claim_name for s in [spec.base, *spec.adapters] if s.pvc is not None}
        for job in jobs.values():
            claim = (((job or {}).get("status") or {}).get("output") or {}).get("claimName")
            if claim:
                claims.add(str(claim))
        present = {claim for claim in sorted(claims) if self.kube.claim_exists(namespace, claim)}
        owner = ServerOwner(name, namespace, body["metadata"]["uid"])
        deployment = self.kube.get_deployment(namespace, owner.child_name)
        pods = self.kube.list_pods_labelled(namespace, f"{LABEL_SERVER}={name}") if deployment is not None else []
        return dataclasses.replace(base, jobs=jobs, claims=present, deployment=deployment, pods=pods)

    def reconcile(self, namespace: str, name: str) -> str | None:
        seen = self.observe(namespace, name)
        for _ in range(MAX_DECISIONS):
            actions = decide(seen)
            if actions.create:
                try:
                    made = [self.kube.create_or_get(child)[0] for child in actions.create]
                except ChildRejected as exc:
                    seen = dataclasses.replace(seen, rejected=str(exc))
                    continue
                seen = dataclasses.replace(seen, deployment=made[-1], pods=[])
                continue
            if actions.apply is not None:
                try:
                    applied = self.kube.apply_deployment(actions.apply)
                except ChildRejected as exc:
                    seen = dataclasses.replace(seen, rejected=str(exc))
                    continue
                seen = dataclasses.replace(seen, deployment=applied)
                continue
            if actions.status_patch is not None and seen.body is not None:
                self._write(seen.body, actions.status_patch, actions.events)
            return actions.phase
        logger.error("modelserver %s/%s: no decision settled after %d tries", namespace, name, MAX_DECISIONS)
        return None

    def _write(self, body: Body, patch: Body, events: tuple[tuple[str, str], ...]) -> None:
        meta = body["metadata"]
        before = (body.get("status") or {}).get("phase")
        self.kube.patch_server_status(meta["namespace"], meta["name"], patch)
        for reason, message in events:
            self.kube.post_event(body, "Warning", reason, message)
        if patch.get("phase") and patch.get("phase") != before:
            logger.info("modelserver %s/%s: phase %s -> %s", meta["namespace"], meta["name"], before, patch["phase"])

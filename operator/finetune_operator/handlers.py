"""What kopf does here, and the wiring of the rest.

kopf watches the FineTuneJobs, registers the handlers below, runs start-up and clean-up, serves
the liveness probe and formats the logs. Everything else is the operator's own: the Jobs', pods'
and Workloads' streams, the watch cache, the work queue and the write pacer (runtime/), and the
reconcile (reconcile.py, deciding in decide.py). Every trigger (a job's event from kopf, its
Job's, pods' and Workload's from the streams, the resync) stores the body and queues the job.

No change-detection handlers, timers or finalizers: those need kopf's per-object state, and a
finalizer would block deleting a job while the operator is down. Deletion is the garbage
collector's work (owner references on every child).

With leader election on (the chart's replicas), every replica lists and watches, so its cache is
warm, but only the holder of the Lease starts the work queue, the pacer, the resync and the
trainer identities: a standby makes no write at all, and its queue only gathers keys. It starts
them on taking the Lease (every cached job is queued then), and a leader that loses the Lease
exits at once: no write of a former leader can land after its successor's.

The `Operator` lives in kopf's memo, made at start-up: importing this module builds nothing.
"""

import asyncio
import gc
import logging
import os
import socket
import sys
import uuid
from collections.abc import Callable, Hashable
from typing import Any

import kopf

from finetune_api.constants import GROUP, LABEL_JOB, LABEL_SERVER, PLURAL, SERVER_PLURAL, VERSION
from finetune_api.contract import TERMINAL_PHASES
from finetune_plan.nodes import facts

from .kube import Body, Kube, describe_error, load_config
from .metrics import Metrics
from .reconcile import Reconciler
from .runtime import streams
from .runtime.cache import Refusal, WatchCache
from .runtime.leader import LeaderElector
from .runtime.pacing import WritePacer
from .runtime.resync import resync_forever
from .runtime.streams import OnEvent, OnRelist, Source, Stream
from .runtime.workqueue import NEW, UPDATE, WorkQueue
from .servers.reconcile import ServerReconciler
from .settings import Settings, from_env
from .workloads import owner_job_name

logger = logging.getLogger(__name__)

# What a cache keeps after a fresh list of one scope: (listed, namespace or None, version) -> keys gone.
KeepListed = Callable[[list[Body], str | None, str], list[tuple[str, str]]]
# Reconciles wait on the API server, not the CPU: enough threads to keep many jobs moving.
WORKERS = 16
# The exit of a leader that could not renew its Lease in time (client-go's controllers exit too).
LOST_LEASE_EXIT_CODE = 3
# How long a leader stopped cleanly lets its reconciles under way finish before it gives the Lease up.
DRAIN_S = 5.0


class Operator:
    """One operator: its cache, queue, pacer, reconciler and streams. Built idle; `start()` runs it."""

    def __init__(self, kube: Kube, settings: Settings, metrics: Metrics, workers: int = WORKERS) -> None:
        self.settings = settings
        self.metrics = metrics
        self.cache = WatchCache()
        self.queue = WorkQueue(self._work, workers)
        self.pacer = WritePacer(lambda key: self.queue.add(key, UPDATE))
        self.reconciler = Reconciler(
            kube=kube, settings=settings, cache=self.cache, queue=self.queue, pacer=self.pacer, metrics=metrics
        )
        # ModelServers: a queue of their own, read straight from the API server (servers/).
        self.servers = ServerReconciler(kube, settings)
        self.streams = [*self._streams(kube, settings.namespaces), *self._server_streams(kube, settings.namespaces)]
        self.tasks: list[asyncio.Task[None]] = []
        self.elector = self._elector(kube, settings)
        self._loop: asyncio.AbstractEventLoop | None = None
        metrics.watch(self.queue.depth, self.pacer.parked)
        # A standby's job series would double every job's (and fire every alert twice).
        metrics.watch_jobs(self.cache, self.leading)
        metrics.leader.set(0)

    def _work(self, key: Hashable) -> None:
        self.reconciler.work(key)

    def _elector(self, kube: Kube, settings: Settings) -> LeaderElector | None:
        if not settings.leader_election or not settings.lease_namespace:
            return None
        # Unique per process, as client-go makes it: a restarted pod is a new candidate.
        identity = f"{settings.pod_name or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        return LeaderElector(
            kube,
            namespace=settings.lease_namespace,
            name=settings.lease_name,
            identity=identity,
            timings=settings.lease_timings,
            on_started_leading=self._lead,
            on_stopped_leading=self._lost,
        )

    def leading(self) -> bool:
        return self.elector is None or self.elector.leading()

    def start(self) -> None:
        """Watch at once; reconcile and write at once too, or once this replica holds the Lease."""
        self._loop = asyncio.get_running_loop()
        for stream in self.streams:
            stream.start()
        if self.elector is None:
            self._lead()
        else:
            logger.info("standby: waiting for the Lease %s/%s", self.elector.namespace, self.elector.name)
            self.elector.start()

    def _lead(self) -> None:
        self.metrics.leader.set(1)
        self.queue.start()
        self.servers.queue.start()
        self.pacer.start()
        # What the watches brought while this replica waited, every job in the cache, goes round once.
        for namespace, name in self.cache.finetunejob_keys():
            body = self.cache.finetunejob(namespace, name)
            urgent = body is not None and self.reconciler.needs_job(namespace, name, body)
            self.reconciler.enqueue(namespace, name, NEW if urgent else UPDATE)
        for namespace, names in list(self.servers.known.items()):
            for name in sorted(names):
                self.servers.enqueue(namespace, name)
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._start_tasks)

    def _start_tasks(self) -> None:
        resync = resync_forever(
            self.settings.resync_seconds, self.pacer.creating, self.cache.finetunejob_keys, self.queue.add
        )
        self.tasks.append(asyncio.create_task(resync))
        servers = resync_forever(self.settings.resync_seconds, lambda: False, self.servers.keys, self.servers.queue.add)
        self.tasks.append(asyncio.create_task(servers))
        if self.settings.namespaces:
            # The namespaces are known up front: their trainer identity is made now, not in the
            # way of the first job (cluster-wide, a namespace's first job still makes it).
            self.tasks.append(asyncio.create_task(asyncio.to_thread(self._prepare_identities)))

    def _lost(self) -> None:
        """Another replica may hold the Lease by now: not one more write from this process."""
        self.metrics.leader.set(0)
        logging.shutdown()
        sys.stderr.flush()
        os._exit(LOST_LEASE_EXIT_CODE)

    def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for stream in self.streams:
            stream.stop()
        if self.elector is not None:
            # Writes end before the Lease is given up, so the successor never overlaps them.
            self.servers.queue.stop(DRAIN_S)
            self.queue.stop(DRAIN_S)
            self.elector.stop(release=True)
            self.metrics.leader.set(0)

    def _prepare_identities(self) -> None:
        for namespace in self.settings.namespaces:
            if namespace in self.settings.excluded_namespaces:
                continue  # its jobs end Failed (NamespaceNotAllowed), and the fence refuses writes there
            try:
                self.reconciler.identities.ensure(namespace)
            except Exception as exc:  # the namespace's first job tries again
                logger.warning("%s: could not make the trainer identity yet: %s", namespace, describe_error(exc))

    # --- the streams' events: store the body, then queue its job (the reconcile sees at least it)

    def _queue(self, namespace: str | None, name: str | None) -> None:
        if namespace and name:
            self.reconciler.enqueue(namespace, name)

    def job_event(self, type: str, body: Body) -> None:
        if type == "DELETED":
            self.cache.drop_job(body)
        else:
            self.cache.put_job(body)
        meta = body.get("metadata") or {}
        self._queue(meta.get("namespace"), (meta.get("labels") or {}).get(LABEL_JOB))

    def pod_event(self, type: str, body: Body) -> None:
        meta = body.get("metadata") or {}
        job = (meta.get("labels") or {}).get(LABEL_JOB)
        if job:
            if type == "DELETED":
                self.cache.drop_pod(job, body)
            else:
                self.cache.put_pod(job, body)
        self._queue(meta.get("namespace"), job)

    def workload_event(self, type: str, body: Body) -> None:
        """Kueue's Workload of one of our Jobs: named after the Job, which is named after the job."""
        job = owner_job_name(body)
        if not job:
            return
        if type == "DELETED":
            self.cache.drop_workload(job, body)
        else:
            self.cache.put_workload(job, body)
        self._queue((body.get("metadata") or {}).get("namespace"), job)

    def node_event(self, type: str, body: Body) -> None:
        """A GPU node came, went or changed: every job not finished is judged again against the
        nodes (finetune_plan.nodes), only when what a verdict reads changed."""
        name = str((body.get("metadata") or {}).get("name") or "")
        found = None if type == "DELETED" else facts(body, self.settings.gpu_product_label, self.settings.gpu_resource)
        if self.cache.put_node(name, found):
            self._judge_again()

    def nodes_relisted(self, listed: list[Body], _version: str) -> None:
        if self.cache.keep_listed_nodes({str((b.get("metadata") or {}).get("name")) for b in listed}):
            self._judge_again()

    def _judge_again(self) -> None:
        for namespace, name in self.cache.finetunejob_keys():
            body = self.cache.finetunejob(namespace, name) or {}
            if (body.get("status") or {}).get("phase") not in TERMINAL_PHASES:
                self._queue(namespace, name)

    def refusal_event(self, type: str, body: Body) -> None:
        """The Job controller could not create a pod of a Job: ours when the cache holds that Job
        (our trainer Job, or a pre-flight Job) by its UID; its job is queued to say why it waits."""
        involved = body.get("involvedObject") or {}
        namespace, name, uid = involved.get("namespace"), involved.get("name"), involved.get("uid")
        if type == "DELETED" or not (namespace and name and uid):
            return
        labels = self.cache.job_labels(namespace, name, uid)
        if labels is None or not labels.get(LABEL_JOB):
            return
        meta = body.get("metadata") or {}
        when = body.get("lastTimestamp") or body.get("eventTime") or meta.get("creationTimestamp") or ""
        self.cache.put_refusal(namespace, name, Refusal(str(uid), str(when), str(body.get("message") or "")))
        self._queue(namespace, labels[LABEL_JOB])

    def finetunejob_event(self, type: str | None, body: Body, namespace: str, name: str) -> None:
        # A server of the namespace may name this job (its phase, its fingerprint, its being gone).
        self.servers.job_changed(namespace)
        if type == "DELETED":
            self.reconciler.forget(namespace, name)
            return
        self.cache.put_finetunejob(body)
        urgent = self.reconciler.needs_job(namespace, name, body)
        self.reconciler.enqueue(namespace, name, NEW if urgent else UPDATE)

    def server_event(self, type: str | None, namespace: str, name: str) -> None:
        self.servers.seen(namespace, name, present=type != "DELETED")
        if type != "DELETED":
            self.servers.enqueue(namespace, name)

    def server_child_event(self, _type: str, body: Body) -> None:
        """A server's Deployment or pod changed: its server (the label) is reconciled."""
        meta = body.get("metadata") or {}
        server = (meta.get("labels") or {}).get(LABEL_SERVER)
        if meta.get("namespace") and server:
            self.servers.enqueue(str(meta["namespace"]), str(server))

    def _server_streams(self, kube: Kube, namespaces: tuple[str, ...]) -> list[Stream]:
        """Deployments and pods labelled with a server: each event queues that server. Nothing is
        kept, so a relist has nothing to forget."""
        sources = streams.server_sources(kube, namespaces, LABEL_SERVER)
        return [Stream(source, self.server_child_event, _nothing_kept) for source in sources]

    def _relisted(self, keep: KeepListed, ns: str | None) -> OnRelist:
        def relisted(listed: list[Body], version: str) -> None:
            for gone_namespace, name in keep(listed, ns, version):
                self._queue(gone_namespace, name)

        return relisted

    def _streams(self, kube: Kube, namespaces: tuple[str, ...]) -> list[Stream]:
        job_sources, pod_sources = streams.sources(kube, namespaces, LABEL_JOB)
        kinds: list[tuple[list[Source], OnEvent, KeepListed]] = [
            (job_sources, self.job_event, self.cache.keep_listed_jobs),
            (pod_sources, self.pod_event, self.cache.keep_listed_pods),
            (streams.workload_sources(kube, namespaces), self.workload_event, self.cache.keep_listed_workloads),
        ]
        made = [Stream(s, on_event, self._relisted(keep, s.namespace)) for ss, on_event, keep in kinds for s in ss]
        made += [
            Stream(s, self.node_event, self.nodes_relisted)
            for s in streams.node_sources(kube, self.settings.gpu_product_label)
        ]
        made += [Stream(s, self.refusal_event, _nothing_kept) for s in streams.refusal_sources(kube, namespaces)]
        return made


def _nothing_kept(_listed: list[Body], _version: str) -> None:
    return None


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf's settings for the one kind it watches."""
    # Against silently frozen watches, the same limits as the operator's own streams.
    settings.watching.server_timeout = streams.SERVER_TIMEOUT_S
    settings.watching.client_timeout = streams.CLIENT_TIMEOUT_S
    settings.watching.connect_timeout = streams.CONNECT_TIMEOUT_S
    settings.watching.inactivity_timeout = streams.INACTIVITY_TIMEOUT_S
    settings.networking.request_timeout = streams.REQUEST_TIMEOUT_S
    # kopf's peering is not leader election (and would need extra CRDs and RBAC): which replica
    # writes is the Lease's to say (runtime/leader.py), and kopf's handlers only fill the cache.
    settings.peering.standalone = True
    # The resources we serve are fixed; watching CRDs for new ones would need cluster-wide RBAC.
    settings.scanning.disabled = True
    # Our Events say what happened; kopf's per-handler "succeeded" Events would only add noise.
    settings.posting.level = logging.WARNING
    # Only kopf's own blocking calls (the login, the probe) use its executor: the event handler
    # is a coroutine that fills the cache and queues a job (the reconciler's workers do the rest).
    settings.execution.max_workers = 4
    # An object's kopf worker holds its last event's body until it exits; under a burst, the
    # default 5 s of idling kept thousands of parsed bodies alive at once.
    settings.batching.idle_timeout = 0.5


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    ours: Settings = memo.get("settings") or from_env()
    configure(settings)
    metrics = Metrics()
    metrics.serve(ours.metrics_port, ours.listen_address)
    operator = Operator(Kube(await asyncio.to_thread(load_config), metrics), ours, metrics)
    memo["operator"] = operator
    operator.start()
    # Everything built so far (imported modules, the API client's models, kopf's registry: about
    # 70 000 objects) lives as long as the process. Frozen, a full collection no longer walks
    # it: unfrozen, one took 265 ms holding the GIL in the middle of a 500-job burst, and the
    # jobs submitted in that moment waited for their Job that much longer.
    gc.collect()
    gc.freeze()
    logger.info(
        "finetune-operator started: %s, trainer image %s",
        "cluster-wide" if ours.clusterwide else f"namespaces {', '.join(ours.namespaces)}",
        ours.trainer_image,
    )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    operator: Operator | None = memo.get("operator")
    if operator is not None:
        operator.stop()


@kopf.on.probe(id="reconciler")
def probe(memo: kopf.Memo, **_: Any) -> bool:
    return memo.get("operator") is not None


@kopf.on.event(GROUP, VERSION, PLURAL)
async def finetunejob_event(
    type: str | None, body: kopf.Body, name: str | None, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    """A coroutine, so kopf runs it on its event loop as the event arrives: it stores the body
    and queues the job, without I/O and behind nothing but short locks. As a plain function it
    went to a thread of kopf's executor first, one more thread (and one more wait for the GIL)
    between a new job's event and the worker that creates its Job."""
    operator: Operator | None = memo.get("operator")
    if operator is not None and namespace and name:
        operator.finetunejob_event(type, dict(body), namespace, name)


@kopf.on.event(GROUP, VERSION, SERVER_PLURAL)
async def modelserver_event(
    type: str | None, name: str | None, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    """A ModelServer changed: queue it (servers/reconcile.py reads it afresh)."""
    operator: Operator | None = memo.get("operator")
    if operator is not None and namespace and name:
        operator.server_event(type, namespace, name)

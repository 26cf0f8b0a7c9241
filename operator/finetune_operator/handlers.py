"""Wiring: every trigger (the job's own events from kopf, its Job's, pods' and Kueue Workload's
events from streams.py, a periodic resync) runs the same level-based reconcile. Handlers stay
thin on purpose.

No change-detection handlers and no timers: those need kopf's per-object state and a
finalizer, and a finalizer would block deleting a job while the operator is down. Deletion is
the garbage collector's work (owner references on every child).
"""

import asyncio
import gc
import logging
from collections.abc import Callable
from typing import Any

import kopf

from finetune_api.constants import GROUP, LABEL_JOB, PLURAL, VERSION

from . import metrics
from .cache import WatchCache
from .kube import Body, Kube, describe_error, load_config
from .reconcile import Reconciler
from .settings import Settings, from_env
from .streams import OnRelist, Stream, sources, workload_sources
from .workloads import owner_job_name
from .workqueue import NEW, UPDATE

logger = logging.getLogger(__name__)

ANNOTATION_PREFIX = GROUP
FINALIZER = f"{GROUP}/finalizer"


class _State:
    """What startup builds and the handlers use; one per process."""

    settings: Settings | None = None
    reconciler: Reconciler | None = None
    # Filled by the handlers below from the first listing on; read by the reconciler.
    cache = WatchCache()
    resync: asyncio.Task[None] | None = None
    identities: asyncio.Task[None] | None = None

    def __init__(self) -> None:
        self.streams: list[Stream] = []


STATE = _State()


def configure(settings: kopf.OperatorSettings, ours: Settings) -> None:
    """kopf settings that must be right from the first start (changing them later needs a migration)."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    # Against silently frozen watches: the server closes each watch, the client gives up on a
    # hung one, and a stream with no events at all for this long is restarted.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.watching.inactivity_timeout = 600
    settings.networking.request_timeout = 60
    # One replica (Deployment strategy Recreate); peering objects would need extra CRDs and RBAC.
    settings.peering.standalone = True
    # The resources we serve are fixed; watching CRDs for new ones would need cluster-wide RBAC.
    settings.scanning.disabled = True
    # Our Events say what happened; kopf's per-handler "succeeded" Events would only add noise.
    settings.posting.level = logging.WARNING
    # The handlers only fill the cache and queue a job (the reconciler's workers do the rest).
    settings.execution.max_workers = 4
    # An object's kopf worker holds its last event's body until it exits; under a burst, the
    # default 5 s of idling kept thousands of parsed bodies alive at once.
    settings.batching.idle_timeout = 0.5


def _reconcile(namespace: str | None, name: str | None, priority: int = UPDATE) -> None:
    if STATE.reconciler is None or not namespace or not name:
        return
    STATE.reconciler.enqueue(namespace, name, priority)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    ours = STATE.settings or from_env()
    STATE.settings = ours
    configure(settings, ours)
    metrics.serve(ours.metrics_port)
    kube = Kube(await asyncio.to_thread(load_config))
    STATE.reconciler = Reconciler(kube, ours, STATE.cache)
    STATE.streams = start_streams(kube, ours.namespaces)
    STATE.resync = asyncio.create_task(_resync_forever(ours))
    if ours.namespaces:
        # The namespaces are known up front: their trainer identity is made now, not in the
        # way of the first job (cluster-wide, a namespace's first job still makes it).
        STATE.identities = asyncio.create_task(
            asyncio.to_thread(_prepare_identities, STATE.reconciler, ours.namespaces)
        )
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
async def cleanup(**_: Any) -> None:
    if STATE.resync is not None:
        STATE.resync.cancel()
    for stream in STATE.streams:
        stream.stop()


@kopf.on.probe(id="reconciler")
def probe(**_: Any) -> bool:
    return STATE.reconciler is not None


def _prepare_identities(reconciler: Reconciler, namespaces: tuple[str, ...]) -> None:
    for namespace in namespaces:
        try:
            reconciler.identities.ensure(namespace)
        except Exception as exc:  # the namespace's first job tries again
            logger.warning("%s: could not make the trainer identity yet: %s", namespace, describe_error(exc))


async def _resync_forever(settings: Settings) -> None:
    """Reconcile every job now and then, so status converges even after missed events.

    The listing refreshes the cache's FineTuneJobs; Jobs and pods are re-listed by their
    streams whenever the server cannot resume a watch.
    """
    while True:
        await asyncio.sleep(settings.resync_seconds)
        reconciler = STATE.reconciler
        if reconciler is None:
            continue
        # A resync reconciles every job at once: a safety net, so it waits while Jobs are being
        # created (at most one more period). In a 500-job run, the jobs submitted while one
        # ran waited up to 0.7 s for their Job (0.1 s typical).
        waited = 0.0
        while reconciler.pacer.creating() and waited < settings.resync_seconds:
            await asyncio.sleep(1.0)
            waited += 1.0
        try:
            await asyncio.to_thread(_resync_once, reconciler, settings.namespaces)
        except Exception as exc:  # the loop must survive an API outage
            logger.warning("resync: listing FineTuneJobs failed: %s", exc)


def _resync_once(reconciler: Reconciler, namespaces: tuple[str, ...]) -> None:
    # Page by page: no page outlives its loop turn, so a resync never holds every job at once.
    for page in reconciler.kube.finetunejob_pages(namespaces):
        for job in page:
            STATE.cache.put_finetunejob(job)
            reconciler.enqueue(job["metadata"]["namespace"], job["metadata"]["name"])


# Each handler stores the body before it triggers: the reconcile then sees at least this event.


@kopf.on.event(GROUP, VERSION, PLURAL)
def finetunejob_event(type: str | None, body: kopf.Body, name: str | None, namespace: str | None, **_: Any) -> None:
    if type == "DELETED":
        if namespace and name:
            if STATE.reconciler is not None:
                STATE.reconciler.forget(namespace, name)  # its cache entry too
            else:
                STATE.cache.forget(namespace, name)
        return
    plain = dict(body)
    STATE.cache.put_finetunejob(plain)
    reconciler = STATE.reconciler
    if reconciler is not None and namespace and name:
        reconciler.enqueue(namespace, name, NEW if reconciler.needs_job(namespace, name, plain) else UPDATE)


# Jobs and pods arrive on streams.py's threads, not through kopf (see there why).


def job_event(type: str, body: Body) -> None:
    if type == "DELETED":
        STATE.cache.drop_job(body)
    else:
        STATE.cache.put_job(body)
    meta = body.get("metadata") or {}
    _reconcile(meta.get("namespace"), (meta.get("labels") or {}).get(LABEL_JOB))


def pod_event(type: str, body: Body) -> None:
    meta = body.get("metadata") or {}
    job = (meta.get("labels") or {}).get(LABEL_JOB)
    if job:
        if type == "DELETED":
            STATE.cache.drop_pod(job, body)
        else:
            STATE.cache.put_pod(job, body)
    _reconcile(meta.get("namespace"), job)


def workload_event(type: str, body: Body) -> None:
    """Kueue's Workload of one of our Jobs: named after the Job, which is named after the job."""
    job = owner_job_name(body)
    if not job:
        return
    if type == "DELETED":
        STATE.cache.drop_workload(job, body)
    else:
        STATE.cache.put_workload(job, body)
    _reconcile((body.get("metadata") or {}).get("namespace"), job)


def _relisted(keep: Callable[[list[Body], str | None, str], list[tuple[str, str]]], namespace: str | None) -> OnRelist:
    def relisted(listed: list[Body], version: str) -> None:
        for gone_namespace, name in keep(listed, namespace, version):
            _reconcile(gone_namespace, name)

    return relisted


def start_streams(kube: Kube, namespaces: tuple[str, ...]) -> list[Stream]:
    job_sources, pod_sources = sources(kube, namespaces, LABEL_JOB)
    started = [Stream(s, job_event, _relisted(STATE.cache.keep_listed_jobs, s.namespace)).start() for s in job_sources]
    started += [Stream(s, pod_event, _relisted(STATE.cache.keep_listed_pods, s.namespace)).start() for s in pod_sources]
    started += [
        Stream(s, workload_event, _relisted(STATE.cache.keep_listed_workloads, s.namespace)).start()
        for s in workload_sources(kube, namespaces)
    ]
    return started

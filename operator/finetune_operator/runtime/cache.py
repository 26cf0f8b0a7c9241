"""The latest FineTuneJobs, Jobs, pods and Kueue Workloads seen on the watch streams (kopf's for
FineTuneJobs, streams.py for the rest), so a reconcile reads memory instead of asking the API
server three times.

Each reconcile used to GET the FineTuneJob, GET its Job and LIST its pods: about two thirds of
the operator's requests under load, and the queue that new jobs waited behind. The watches
already stream every one of those objects; keeping the newest body of each is the informer
pattern other controllers use.

Freshness: a handler stores a body before it triggers the reconcile, so a reconcile never
sees less than the event that caused it. Writes the operator makes itself (a created Job, a
status patch) are stored from the API server's reply, and an older body arriving later on a
watch never replaces a newer one. A miss (the watch has not caught up yet) falls back to the
API server.

Ordering resourceVersions: the API conventions long called them opaque, with equality the only
comparison. KEP-5504 (stable in Kubernetes 1.35, with a helper in client-go and a conformance
test) makes versions of one resource type comparable, and states what kube-apiserver has
always done: a version is an etcd revision, a decimal integer without leading zeros that grows
with every write. This cache compares only versions of the same kind (one store per kind) and
only when both are well formed in that sense (`_as_int`, the KEP's check); any other version
(an aggregated API's, a server that does not promise order) is not ordered, and the body that
arrived last wins, as with equality alone.

Two more things are kept, already read down to what a verdict needs: the GPU nodes' facts
(finetune_plan.nodes.NodeFacts: product, allocatable GPUs and memory), for whether any node can
ever hold a job's pods, and the Job controller's last refusal to create a pod of one of our Jobs
(its FailedCreate Event: a ResourceQuota's words), which a Job's status never carries.

Bodies are trimmed to what the status logic reads (no managedFields, no pod template, no pod
spec but its node) and held as compact JSON text, not as trees of dicts: a parsed body costs
several times its JSON in Python objects, and at 500 jobs the trees were the largest part of
the operator's memory. Every read parses a fresh copy, so no caller can change what another
one reads. A body is packed before the lock is taken: the lock is shared by every stream, the
reconcile workers and kopf's event handler (on its event loop), and is held only to compare
versions and store.
"""

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from finetune_api.contract import CONFIG_ANNOTATION
from finetune_plan.nodes import NodeFacts

Body = dict[str, Any]
Key = tuple[str, str]
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# Annotations that hold whole documents nothing here reads: kubectl's copy of an applied object,
# and the trainer config that every pod of ours carries.
BULKY_ANNOTATIONS = frozenset({LAST_APPLIED, CONFIG_ANNOTATION})


@dataclass(frozen=True)
class Refusal:
    """The Job controller could not create a pod of a Job (its FailedCreate Event, e.g. a
    ResourceQuota's refusal): the Job's UID, the Event's last time (RFC 3339) and its words."""

    uid: str
    time: str
    message: str


def _as_int(version: str | None) -> int | None:
    """The version as a number when it is one KEP-5504 orders: decimal digits, no leading zero."""
    if not version or not version.isdecimal() or not version.isascii() or version[0] == "0":
        return None
    return int(version)


def _version(body: Body) -> int | None:
    return _as_int((body.get("metadata") or {}).get("resourceVersion"))


@dataclass(frozen=True)
class _Packed:
    """One trimmed body as compact JSON, with what ordering and identity checks need."""

    version: int | None
    uid: str | None
    text: str

    @classmethod
    def of(cls, trimmed: Body) -> "_Packed":
        uid = (trimmed.get("metadata") or {}).get("uid")
        return cls(_version(trimmed), uid, json.dumps(trimmed, separators=(",", ":")))

    def body(self) -> Body:
        unpacked: Body = json.loads(self.text)
        return unpacked


def _older(held: "_Packed", listed_at: int | None) -> bool:
    """Whether a held body predates a list taken at `listed_at` (unknown order: assume so)."""
    return held.version is None or listed_at is None or held.version <= listed_at


def _newer_or_equal(incoming: Body, held: _Packed | None) -> bool:
    if held is None:
        return True
    new, old = _version(incoming), held.version
    # Opaque (non-numeric) versions cannot be ordered: the one that arrived last wins.
    return new is None or old is None or new >= old


def _metadata(body: Body) -> Body:
    meta = dict(body.get("metadata") or {})
    meta.pop("managedFields", None)
    annotations = meta.get("annotations")
    if annotations and not BULKY_ANNOTATIONS.isdisjoint(annotations):
        meta["annotations"] = {k: v for k, v in annotations.items() if k not in BULKY_ANNOTATIONS}
    return meta


def trim_finetunejob(body: Body) -> Body:
    return {**body, "metadata": _metadata(body)}


def trim_job(body: Body) -> Body:
    spec = {k: v for k, v in (body.get("spec") or {}).items() if k != "template"}
    return {"metadata": _metadata(body), "spec": spec, "status": body.get("status") or {}}


def trim_workload(body: Body) -> Body:
    """A Kueue Workload without its pod sets (whole pod templates): status is what is read."""
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    kept_status = {k: v for k, v in status.items() if k in ("conditions", "admission", "requeueState")}
    admission = kept_status.get("admission")
    if isinstance(admission, dict):
        kept_status["admission"] = {"clusterQueue": admission.get("clusterQueue")}
    return {
        "metadata": _metadata(body),
        "spec": {k: v for k, v in spec.items() if k in ("queueName", "priority", "active")},
        "status": kept_status,
    }


def trim_pod(body: Body) -> Body:
    spec = body.get("spec") or {}
    return {
        "metadata": _metadata(body),
        "spec": {"nodeName": spec["nodeName"]} if spec.get("nodeName") else {},
        "status": body.get("status") or {},
    }


class WatchCache:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._finetunejobs: dict[Key, _Packed] = {}
        self._jobs: dict[Key, _Packed] = {}
        # (namespace, FineTuneJob name) -> pod name -> pod
        self._pods: dict[Key, dict[str, _Packed]] = {}
        # (namespace, Job name) -> Workload name -> Workload (Kueue's, for queued jobs)
        self._workloads: dict[Key, dict[str, _Packed]] = {}
        # Node name -> its facts; None until the nodes were listed once (or where they cannot be).
        self._nodes: dict[str, NodeFacts] | None = None
        # (namespace, Job name) -> the Job controller's last refusal to create a pod of it
        self._refusals: dict[Key, Refusal] = {}

    # --- FineTuneJobs ---------------------------------------------------------------------

    def put_finetunejob(self, body: Body) -> None:
        key, packed = _key(body), _Packed.of(trim_finetunejob(body))
        with self._guard:
            if _newer_or_equal(body, self._finetunejobs.get(key)):
                self._finetunejobs[key] = packed

    def finetunejob(self, namespace: str, name: str) -> Body | None:
        with self._guard:
            held = self._finetunejobs.get((namespace, name))
        return held.body() if held is not None else None

    def finetunejob_keys(self) -> list[Key]:
        with self._guard:
            return list(self._finetunejobs)

    def forget(self, namespace: str, name: str) -> None:
        """The FineTuneJob is gone; its children follow through the garbage collector."""
        with self._guard:
            self._finetunejobs.pop((namespace, name), None)

    # --- Jobs (named as their FineTuneJob) ----------------------------------------------------

    def put_job(self, body: Body) -> None:
        key, packed = _key(body), _Packed.of(trim_job(body))
        with self._guard:
            if _newer_or_equal(body, self._jobs.get(key)):
                self._jobs[key] = packed

    def drop_job(self, body: Body) -> None:
        key = _key(body)
        uid = (body.get("metadata") or {}).get("uid")
        with self._guard:
            held = self._jobs.get(key)
            if held is not None and held.uid == uid:
                del self._jobs[key]
                self._refusals.pop(key, None)

    def keep_listed_jobs(self, listed: list[Body], namespace: str | None, version: str) -> list[Key]:
        """After a list of one namespace's Jobs (None: all namespaces) at resourceVersion
        `version`, forget the Jobs it no longer has (deleted while the watch was away); their
        keys. A Job stored after the list was taken (a create's reply) is newer and stays."""
        present = {_key(body) for body in listed}
        listed_at = _as_int(version)
        with self._guard:
            gone = [
                k
                for k, held in self._jobs.items()
                if (namespace is None or k[0] == namespace) and k not in present and _older(held, listed_at)
            ]
            for key in gone:
                del self._jobs[key]
                self._refusals.pop(key, None)
        return gone

    def job(self, namespace: str, name: str) -> Body | None:
        with self._guard:
            held = self._jobs.get((namespace, name))
        return held.body() if held is not None else None

    def has_job(self, namespace: str, name: str) -> bool:
        """Whether a Job of this name is held: asked for every FineTuneJob event, unparsed."""
        with self._guard:
            return (namespace, name) in self._jobs

    def job_labels(self, namespace: str, name: str, uid: str | None) -> dict[str, str] | None:
        """The labels of the Job held under this name, if it is the one with this UID."""
        with self._guard:
            held = self._jobs.get((namespace, name))
        if held is None or held.uid != uid:
            return None
        return dict((held.body().get("metadata") or {}).get("labels") or {})

    def put_refusal(self, namespace: str, name: str, refusal: Refusal) -> None:
        """The Job controller could not create a pod of the Job (namespace, name): the newest wins."""
        with self._guard:
            held = self._refusals.get((namespace, name))
            if held is None or held.uid != refusal.uid or held.time <= refusal.time:
                self._refusals[(namespace, name)] = refusal

    def refusal(self, job: Body | None) -> Refusal | None:
        """The Job controller's last refusal to create a pod of this Job (this UID), if any."""
        if job is None:
            return None
        with self._guard:
            held = self._refusals.get(_key(job))
        return held if held is not None and held.uid == (job.get("metadata") or {}).get("uid") else None

    def job_key_by_uid(self, uid: str) -> Key | None:
        """(namespace, name) of the Job with this UID, if it is one of ours (a preemptor's)."""
        with self._guard:
            return next((key for key, held in self._jobs.items() if held.uid == uid), None)

    # --- pods (grouped by their FineTuneJob's label) ----------------------------------------

    def put_pod(self, job_name: str, body: Body) -> None:
        self._put_grouped(self._pods, job_name, body, trim_pod)

    def drop_pod(self, job_name: str, body: Body) -> None:
        self._drop_grouped(self._pods, job_name, body)

    def keep_listed_pods(self, listed: list[Body], namespace: str | None, version: str) -> list[Key]:
        """As keep_listed_jobs, for pods; the (namespace, FineTuneJob) keys that lost a pod."""
        return self._keep_listed_grouped(self._pods, listed, namespace, version)

    def pods(self, namespace: str, job_name: str) -> list[Body]:
        return self._grouped(self._pods, namespace, job_name)

    # --- Kueue Workloads (grouped by the name of the Job that owns them) --------------------

    def put_workload(self, job_name: str, body: Body) -> None:
        self._put_grouped(self._workloads, job_name, body, trim_workload)

    def drop_workload(self, job_name: str, body: Body) -> None:
        self._drop_grouped(self._workloads, job_name, body)

    def keep_listed_workloads(self, listed: list[Body], namespace: str | None, version: str) -> list[Key]:
        """As keep_listed_pods, for Workloads; the (namespace, Job) keys that lost one."""
        return self._keep_listed_grouped(self._workloads, listed, namespace, version)

    def workloads(self, namespace: str, job_name: str) -> list[Body]:
        return self._grouped(self._workloads, namespace, job_name)

    # --- GPU nodes (their facts only) -----------------------------------------------------

    def put_node(self, name: str, facts: NodeFacts | None) -> bool:
        """The node's facts now (None: it no longer carries the product label); whether they
        changed what a verdict reads (a node's status is written every few seconds, its facts
        rarely)."""
        with self._guard:
            nodes = self._nodes if self._nodes is not None else {}
            before = nodes.pop(name, None)
            if facts is not None:
                nodes[name] = facts
            self._nodes = nodes
            return before != facts

    def keep_listed_nodes(self, names: set[str]) -> bool:
        """After a list: the nodes are known from now on, and those it lacks are gone; whether any was."""
        with self._guard:
            nodes = self._nodes if self._nodes is not None else {}
            gone = [n for n in nodes if n not in names]
            for name in gone:
                del nodes[name]
            self._nodes = nodes
            return bool(gone)

    def nodes(self) -> tuple[NodeFacts, ...] | None:
        """Every GPU node's facts, by name; None before the first list, or where nodes cannot be read."""
        with self._guard:
            return None if self._nodes is None else tuple(self._nodes[n] for n in sorted(self._nodes))

    # --- objects grouped by the name of what they belong to (pods, Workloads) ---------------

    def _put_grouped(
        self, groups: dict[Key, dict[str, _Packed]], owner: str, body: Body, trim: Callable[[Body], Body]
    ) -> None:
        (namespace, name), packed = _key(body), _Packed.of(trim(body))
        with self._guard:
            held = groups.setdefault((namespace, owner), {})
            if _newer_or_equal(body, held.get(name)):
                held[name] = packed

    def _drop_grouped(self, groups: dict[Key, dict[str, _Packed]], owner: str, body: Body) -> None:
        namespace, name = _key(body)
        with self._guard:
            held = groups.get((namespace, owner))
            if held is not None:
                held.pop(name, None)
                if not held:
                    del groups[(namespace, owner)]

    def _keep_listed_grouped(
        self, groups: dict[Key, dict[str, _Packed]], listed: list[Body], namespace: str | None, version: str
    ) -> list[Key]:
        present = {_key(body) for body in listed}
        listed_at = _as_int(version)
        touched: list[Key] = []
        with self._guard:
            for key, held in list(groups.items()):
                if namespace is not None and key[0] != namespace:
                    continue
                gone = [n for n, packed in held.items() if (key[0], n) not in present and _older(packed, listed_at)]
                for name in gone:
                    del held[name]
                if gone:
                    touched.append(key)
                if not held:
                    del groups[key]
        return touched

    def _grouped(self, groups: dict[Key, dict[str, _Packed]], namespace: str, owner: str) -> list[Body]:
        with self._guard:
            held = list((groups.get((namespace, owner)) or {}).values())
        return [packed.body() for packed in held]

    def sizes(self) -> dict[str, int]:
        with self._guard:
            return {
                "finetunejobs": len(self._finetunejobs),
                "jobs": len(self._jobs),
                "pods": sum(len(p) for p in self._pods.values()),
                "workloads": sum(len(w) for w in self._workloads.values()),
            }


def _key(body: Body) -> Key:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")

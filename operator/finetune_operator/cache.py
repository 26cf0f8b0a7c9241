"""The latest FineTuneJobs, Jobs and pods seen on kopf's watch streams, so a reconcile reads
memory instead of asking the API server three times.

Each reconcile used to GET the FineTuneJob, GET its Job and LIST its pods: about two thirds of
the operator's requests under load, and the queue that new jobs waited behind. kopf already
streams every one of those objects to the event handlers; keeping the newest body of each is
the informer pattern other controllers use.

Freshness: a handler stores a body before it triggers the reconcile, so a reconcile never
sees less than the event that caused it. Writes the operator makes itself (a created Job, a
status patch) are stored from the API server's reply, and an older body arriving later on a
watch never replaces a newer one (resourceVersions compared as numbers; etcd issues them in
order). A miss (the watch has not caught up yet) falls back to the API server.

Bodies are trimmed to what the status logic reads (no managedFields, no pod template, no pod
spec but its node) and held as compact JSON text, not as trees of dicts: a parsed body costs
several times its JSON in Python objects, and at 500 jobs the trees were the largest part of
the operator's memory. Every read parses a fresh copy, so no caller can change what another
one reads.
"""

import json
import threading
from dataclasses import dataclass
from typing import Any

from .builders.paths import CONFIG_ANNOTATION

Body = dict[str, Any]
Key = tuple[str, str]
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# Annotations that hold whole documents nothing here reads: kubectl's copy of an applied object,
# and the trainer config that every pod of ours carries.
BULKY_ANNOTATIONS = frozenset({LAST_APPLIED, CONFIG_ANNOTATION})


def _version(body: Body) -> int | None:
    try:
        return int((body.get("metadata") or {}).get("resourceVersion") or "")
    except ValueError:
        return None


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

    # --- FineTuneJobs ---------------------------------------------------------------------

    def put_finetunejob(self, body: Body) -> None:
        key = _key(body)
        with self._guard:
            if _newer_or_equal(body, self._finetunejobs.get(key)):
                self._finetunejobs[key] = _Packed.of(trim_finetunejob(body))

    def finetunejob(self, namespace: str, name: str) -> Body | None:
        with self._guard:
            held = self._finetunejobs.get((namespace, name))
        return held.body() if held is not None else None

    def forget(self, namespace: str, name: str) -> None:
        """The FineTuneJob is gone; its children follow through the garbage collector."""
        with self._guard:
            self._finetunejobs.pop((namespace, name), None)

    # --- Jobs (named as their FineTuneJob) ----------------------------------------------------

    def put_job(self, body: Body) -> None:
        key = _key(body)
        with self._guard:
            if _newer_or_equal(body, self._jobs.get(key)):
                self._jobs[key] = _Packed.of(trim_job(body))

    def drop_job(self, body: Body) -> None:
        key = _key(body)
        uid = (body.get("metadata") or {}).get("uid")
        with self._guard:
            held = self._jobs.get(key)
            if held is not None and held.uid == uid:
                del self._jobs[key]

    def job(self, namespace: str, name: str) -> Body | None:
        with self._guard:
            held = self._jobs.get((namespace, name))
        return held.body() if held is not None else None

    # --- pods (grouped by their FineTuneJob's label) ----------------------------------------

    def put_pod(self, job_name: str, body: Body) -> None:
        namespace, pod_name = _key(body)
        with self._guard:
            pods = self._pods.setdefault((namespace, job_name), {})
            if _newer_or_equal(body, pods.get(pod_name)):
                pods[pod_name] = _Packed.of(trim_pod(body))

    def drop_pod(self, job_name: str, body: Body) -> None:
        namespace, pod_name = _key(body)
        with self._guard:
            pods = self._pods.get((namespace, job_name))
            if pods is not None:
                pods.pop(pod_name, None)
                if not pods:
                    del self._pods[(namespace, job_name)]

    def pods(self, namespace: str, job_name: str) -> list[Body]:
        with self._guard:
            held = list((self._pods.get((namespace, job_name)) or {}).values())
        return [p.body() for p in held]

    def sizes(self) -> dict[str, int]:
        with self._guard:
            return {
                "finetunejobs": len(self._finetunejobs),
                "jobs": len(self._jobs),
                "pods": sum(len(p) for p in self._pods.values()),
            }


def _key(body: Body) -> Key:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")

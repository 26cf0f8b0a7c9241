"""Leader election on a `coordination.k8s.io/v1` Lease, the way client-go's leaderelection does it.

Two or more replicas run; each lists and watches (its cache stays warm) but only the holder of
the Lease reconciles and writes. A candidate reads the Lease every `retry_period_s` and takes it
when it is free or when its record has not changed for `lease_duration_s` by the candidate's own
clock (the holder's clock is never trusted: client-go judges expiry by when it last saw the
record change, not by the record's renewTime). The leader renews every `retry_period_s`; when
no renewal has succeeded for `renew_deadline_s` it has lost the Lease and must stop writing at
once: `on_stopped_leading` is called, and the operator exits (a restarted pod is a standby
again). `renew_deadline_s < lease_duration_s`, so a leader that cannot renew stops before any
standby may take over.

A leader that is stopped cleanly (SIGTERM, a rolling update) gives the Lease up (an empty
holder), so its standby takes over within one retry period instead of a whole lease duration.

The Lease's writes are plain PUTs with the last resourceVersion seen: two candidates that race
for a free Lease cannot both win (the second gets 409 Conflict). A leader renews with the
resourceVersion of its own last write and reads the Lease again only after a conflict, so it
costs one request per retry period.
"""

import datetime
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..kube import Conflict

logger = logging.getLogger(__name__)

Body = dict[str, Any]


@dataclass(frozen=True)
class LeaseTimings:
    """client-go's defaults: 15 s, 10 s, 2 s (the chart's `leaderElection` values)."""

    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def problem(self) -> str | None:
        """Why these timings cannot keep one leader at a time, or None."""
        if min(self.lease_duration_s, self.renew_deadline_s, self.retry_period_s) <= 0:
            return "every lease timing must be positive"
        if self.renew_deadline_s >= self.lease_duration_s:
            return "the renew deadline must be shorter than the lease duration"
        if self.retry_period_s * 1.2 >= self.renew_deadline_s:
            return "the retry period (x1.2) must be shorter than the renew deadline"
        return None


class LeaseApi(Protocol):
    """The three calls election needs (kube.Kube has them)."""

    def get_lease(self, namespace: str, name: str) -> Body | None: ...
    def create_lease(self, namespace: str, body: Body) -> Body: ...
    def replace_lease(self, namespace: str, name: str, body: Body) -> Body: ...


def micro_time(now: datetime.datetime | None = None) -> str:
    """A Lease's MicroTime (RFC 3339 with microseconds, UTC)."""
    return (now or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def holder(lease: Body | None) -> str:
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def claimed(lease: Body | None, *, namespace: str, name: str, identity: str, duration_s: float, stamp: str) -> Body:
    """The Lease as `identity` writes it to take it (or keep it): acquireTime and the transition
    count move only when the holder changes. Pure."""
    spec = dict((lease or {}).get("spec") or {})
    if spec.get("holderIdentity") != identity:
        spec["acquireTime"] = stamp
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if lease else 0)
    spec.update(holderIdentity=identity, leaseDurationSeconds=max(1, round(duration_s)), renewTime=stamp)
    metadata: Body = {"name": name, "namespace": namespace}
    if lease is not None:
        metadata["resourceVersion"] = lease["metadata"]["resourceVersion"]
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}


def released(lease: Body) -> Body:
    """The Lease given up by its holder (client-go's ReleaseOnCancel): no holder, so any
    candidate may take it at its next try. Pure."""
    spec = {**(lease.get("spec") or {}), "holderIdentity": "", "leaseDurationSeconds": 1}
    return {**lease, "spec": spec}


class LeaderElector:
    """One candidate. `run()` blocks (on a thread of its own): it campaigns until it leads, calls
    `on_started_leading`, renews until it cannot, then calls `on_stopped_leading`."""

    def __init__(
        self,
        api: LeaseApi,
        *,
        namespace: str,
        name: str,
        identity: str,
        timings: LeaseTimings,
        on_started_leading: Callable[[], None],
        on_stopped_leading: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timings = timings
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._clock = clock
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._leading = False
        # The record last seen and when it was first seen as it is (by our clock).
        self._observed: Body | None = None
        self._observed_spec: Body | None = None
        self._observed_at = float("-inf")
        self._thread = threading.Thread(target=self.run, name="leader-election", daemon=True)

    def start(self) -> "LeaderElector":
        self._thread.start()
        return self

    def leading(self) -> bool:
        with self._lock:
            return self._leading

    def run(self) -> None:
        while not self._stop.is_set():
            if self._try():
                break
            self._stop.wait(self.timings.retry_period_s)
        if self._stop.is_set():
            return
        with self._lock:
            self._leading = True
        logger.info("%s: leading (Lease %s/%s)", self.identity, self.namespace, self.name)
        self._on_started()
        self._renew_until_lost()

    def _renew_until_lost(self) -> None:
        last_renewal = self._clock()
        while not self._stop.wait(self.timings.retry_period_s):
            if self._try():
                last_renewal = self._clock()
            elif self._clock() - last_renewal >= self.timings.renew_deadline_s:
                break
        if self._stop.is_set():
            return
        with self._lock:
            self._leading = False
        logger.error(
            "%s: lost the Lease %s/%s (no renewal for %.0f s): stopping",
            self.identity,
            self.namespace,
            self.name,
            self.timings.renew_deadline_s,
        )
        self._on_stopped()

    def _try(self) -> bool:
        """One attempt to take or renew the Lease; True when we hold it afterwards."""
        try:
            return self._try_once()
        except Conflict:
            self._observed = None  # read it again next time
            return False
        except Exception as exc:  # the API server away or slow: the next period tries again
            logger.warning("%s: Lease %s/%s: %s", self.identity, self.namespace, self.name, exc)
            self._observed = None
            return False

    def _try_once(self) -> bool:
        stamp = micro_time()
        if self.leading() and self._observed is not None:
            # The fast path: renew over our own last write; a conflict means someone else wrote.
            self._write(self._claimed(self._observed, stamp))
            return True
        lease = self.api.get_lease(self.namespace, self.name)
        if lease is None:
            body = self._claimed(None, stamp)
            self._seen(self.api.create_lease(self.namespace, body))
            return True
        self._seen(lease)
        current = holder(lease)
        if current and current != self.identity:
            seconds = float((lease.get("spec") or {}).get("leaseDurationSeconds") or self.timings.lease_duration_s)
            if self._clock() < self._observed_at + seconds:
                return False  # held, and renewed within its duration as far as we can tell
        self._write(self._claimed(lease, stamp))
        return True

    def _claimed(self, lease: Body | None, stamp: str) -> Body:
        return claimed(
            lease,
            namespace=self.namespace,
            name=self.name,
            identity=self.identity,
            duration_s=self.timings.lease_duration_s,
            stamp=stamp,
        )

    def _write(self, body: Body) -> None:
        self._seen(self.api.replace_lease(self.namespace, self.name, body))

    def _seen(self, lease: Body) -> None:
        spec = lease.get("spec") or {}
        if spec != self._observed_spec:
            self._observed_spec = spec
            self._observed_at = self._clock()
        self._observed = lease

    def stop(self, release: bool = True) -> None:
        """Stop campaigning; a leader gives the Lease up (unless `release` is False)."""
        self._stop.set()
        if not (release and self.leading() and self._observed is not None):
            return
        with self._lock:
            self._leading = False
        try:
            self.api.replace_lease(self.namespace, self.name, released(self._observed))
            logger.info("%s: gave up the Lease %s/%s", self.identity, self.namespace, self.name)
        except Exception as exc:  # it expires by itself within its duration
            logger.warning("%s: could not give up the Lease %s/%s: %s", self.identity, self.namespace, self.name, exc)

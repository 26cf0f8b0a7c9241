"""Readiness probes and preStop sleeps, as the kubelet runs them, for the agent's pods.

Only what the product's pods use: an `httpGet` readiness probe against the pod's own address (a
ModelServer's llama-server answers /health with 200 once its model is loaded), and a `preStop`
`sleep` before SIGTERM. A container without a readiness probe is ready while it runs, as before.
Each pod with probes gets one thread that probes every container at its period and records the
results; the pod's thread reads them and reports a change of readiness.
"""

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# The kubelet's defaults (core/v1 Probe).
DEFAULT_PERIOD_S = 10.0
DEFAULT_TIMEOUT_S = 1.0
DEFAULT_FAILURES = 3


@dataclass(frozen=True)
class HttpProbe:
    url: str
    period_s: float
    timeout_s: float
    initial_delay_s: float
    failure_threshold: int


def _port(container: Mapping[str, Any], port: Any) -> int | None:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    if isinstance(port, str) and port.isdigit():
        return int(port)
    for entry in container.get("ports") or []:
        if entry.get("name") == port:
            return int(entry["containerPort"])
    return None


def readiness_probe(container: Mapping[str, Any], address: str) -> HttpProbe | None:
    """The container's httpGet readiness probe against `address` (its pod's), or None."""
    probe = container.get("readinessProbe") or {}
    get = probe.get("httpGet")
    if not get:
        return None
    port = _port(container, get.get("port"))
    if port is None:
        return None
    scheme = str(get.get("scheme") or "HTTP").lower()
    path = str(get.get("path") or "/")
    return HttpProbe(
        url=f"{scheme}://{get.get('host') or address}:{port}{path}",
        period_s=float(probe.get("periodSeconds") or DEFAULT_PERIOD_S),
        timeout_s=float(probe.get("timeoutSeconds") or DEFAULT_TIMEOUT_S),
        initial_delay_s=float(probe.get("initialDelaySeconds") or 0),
        failure_threshold=int(probe.get("failureThreshold") or DEFAULT_FAILURES),
    )


def prestop_sleep(container: Mapping[str, Any]) -> float:
    """Seconds of the container's `preStop: sleep`, 0 without one."""
    sleep = ((container.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}
    return float(sleep.get("seconds") or 0)


def http_ok(url: str, timeout: float) -> bool:
    """A success as the kubelet counts one: a status from 200 to 399."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= int(response.status) < 400
    except (urllib.error.URLError, OSError, ValueError):
        return False


class Prober(threading.Thread):
    """Probes each probed container while `running(name)` says it runs; `ready` holds the results."""

    def __init__(self, probes: Mapping[str, HttpProbe], running: Callable[[str], bool], stop: threading.Event) -> None:
        super().__init__(name="prober", daemon=True)
        self.probes = dict(probes)
        self.running = running
        self.stop = stop
        self.ready: dict[str, bool] = dict.fromkeys(self.probes, False)
        self._failures: dict[str, int] = dict.fromkeys(self.probes, 0)
        self._due: dict[str, float] = {}
        self._since: dict[str, float] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            for name, probe in self.probes.items():
                self._probe(name, probe, now)
            self.stop.wait(0.2)

    def _probe(self, name: str, probe: HttpProbe, now: float) -> None:
        if not self.running(name):
            # A restarted container starts unready, its initial delay counted anew.
            self.ready[name] = False
            self._since.pop(name, None)
            self._due.pop(name, None)
            return
        since = self._since.setdefault(name, now)
        if now - since < probe.initial_delay_s or now < self._due.get(name, 0.0):
            return
        self._due[name] = now + probe.period_s
        if http_ok(probe.url, probe.timeout_s):
            self._failures[name] = 0
            self.ready[name] = True
            return
        self._failures[name] += 1
        if self._failures[name] >= probe.failure_threshold or not self.ready[name]:
            self.ready[name] = False

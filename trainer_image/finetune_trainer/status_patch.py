"""Live progress into the FineTuneJob: `status.progress`, `status.lastCheckpoint` and, once
trained, `status.sample` (the first sample answer); nothing else.

The trainer uses its pod's ServiceAccount (or KUBECONFIG when set) and sends JSON merge patches
to the status subresource, at most every `interval` seconds plus at each checkpoint. Patching
runs on a background thread: a slow or unreachable API server is logged and never slows or
stops training. The operator owns every other status field and never writes these two.
"""

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from finetune_api.constants import GROUP, PLURAL, VERSION
from finetune_api.contract import now

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT_S = 10


def _api() -> Any:
    from kubernetes import client, config

    if os.environ.get("KUBECONFIG"):
        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.environ["KUBECONFIG"], client_configuration=configuration
        )
    else:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.CustomObjectsApi(client.ApiClient(configuration))


def _namespace(configured: str | None) -> str | None:
    if configured:
        return configured
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return (SERVICE_ACCOUNT_DIR / "namespace").read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


class StatusReporter:
    """Coalesces progress updates and patches them from a daemon thread."""

    def __init__(self, job_name: str, namespace: str, api: Any, interval: float = 10.0) -> None:
        self.job_name = job_name
        self.namespace = namespace
        self.interval = interval
        self._api = api
        self._pending: dict[str, Any] = {}
        self._due = False
        self._last_sent = 0.0
        self._closed = False
        self._wake = threading.Condition()
        self.sent = 0
        self.failed = 0
        self._thread = threading.Thread(target=self._loop, name="status-patch", daemon=True)
        self._thread.start()

    @classmethod
    def from_environment(cls, job_name: str, namespace: str | None, interval: float = 10.0) -> "StatusReporter | None":
        """A reporter when a cluster is reachable in principle (in a pod, or KUBECONFIG set); else None."""
        in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (SERVICE_ACCOUNT_DIR / "token").is_file()
        if not job_name or not (in_pod or os.environ.get("KUBECONFIG")):
            return None
        ns = _namespace(namespace)
        if ns is None:
            log.warning("status patches off: namespace of FineTuneJob %s unknown", job_name)
            return None
        try:
            api = _api()
        except Exception as exc:  # a broken kubeconfig must not stop training
            log.warning("status patches off: cannot configure the Kubernetes client: %s", exc)
            return None
        log.info("status patches on: finetunejobs/%s in namespace %s", job_name, ns)
        return cls(job_name, ns, api, interval)

    def progress(self, progress: dict[str, Any]) -> None:
        with self._wake:
            self._pending["progress"] = {**progress, "updatedAt": now()}
            self._wake.notify()

    def checkpoint(self, step: int, path: str, when: str) -> None:
        with self._wake:
            self._pending["lastCheckpoint"] = {"step": step, "path": path, "time": when}
            self._due = True
            self._wake.notify()

    def sample(self, sample: dict[str, Any]) -> None:
        with self._wake:
            self._pending["sample"] = sample
            self._due = True
            self._wake.notify()

    def close(self, timeout: float = 15.0) -> None:
        """Send what is pending, then stop; never waits longer than `timeout`."""
        with self._wake:
            self._closed = True
            self._due = True
            self._wake.notify()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._pending or not (self._due or time.monotonic() - self._last_sent >= self.interval):
                    if self._closed and not self._pending:
                        return
                    wait = (
                        None if not self._pending else max(0.05, self.interval - (time.monotonic() - self._last_sent))
                    )
                    self._wake.wait(wait)
                body, self._pending, self._due = self._pending, {}, False
            self._send(body)

    def _send(self, status: dict[str, Any]) -> None:
        self._last_sent = time.monotonic()
        try:
            self._api.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                self.job_name,
                {"status": status},
                _content_type=MERGE_PATCH,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
            self.sent += 1
        except Exception as exc:  # unreachable, forbidden, deleted: log and keep training
            self.failed += 1
            log.warning("status patch failed (training goes on): %s", str(exc).splitlines()[0] if str(exc) else exc)

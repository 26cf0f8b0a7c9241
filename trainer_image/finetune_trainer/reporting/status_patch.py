"""Live progress into the FineTuneJob: `status.progress`, `status.lastCheckpoint`, the base
model's `status.modelFingerprint`, `status.evaluation` (the base against the tuned model) and,
once trained, `status.sample` (the first sample answer); nothing else.

The trainer uses its pod's ServiceAccount (or KUBECONFIG when set) and sends JSON merge patches
to the status subresource, at most every `interval` seconds plus at each checkpoint. Patching
runs on a background thread: a slow or unreachable API server is logged and never slows or
stops training. The operator owns every other status field and never writes these.

A patch the server could not take (no answer, 429, 5xx) is carried into the next one, newer
fields over it, so a lost checkpoint or sample comes back with the next progress. The last
status (the final step, loss and sample) has no next one: `close` retries it, backing off,
for up to FINAL_PATCH_S, which costs training nothing since it has ended. Only where the server
answered once in the run (it is there, only busy): one that never answered (a wrong address, a
network that drops the traffic) gets no more tries at the end than it got before.
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
# How long `close` may spend landing the last status by default (a run that ended well).
FINAL_PATCH_S = 60.0
# The wait between two tries of the last status: doubled after each failure, up to the cap.
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 8.0
# The least time left before the deadline that is worth another try.
MIN_TRY_S = 1.0
# Answers that say "not now" rather than "never": retried. Others (403, 404, 422) would fail
# again alike.
RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


def _api() -> Any:
    from kubernetes import client, config

    if os.environ.get("KUBECONFIG"):
        configuration = client.Configuration()
        # The kubernetes client ships no annotations (its loaders are untyped).
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=os.environ["KUBECONFIG"], client_configuration=configuration
        )
    else:
        configuration = client.Configuration()
        # The kubernetes client ships no annotations (its loaders are untyped).
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


def _retryable(exc: Exception) -> bool:
    """Whether the server may take the same patch later: no answer at all (refused, reset,
    timed out) or an answer that says it is busy."""
    status = getattr(exc, "status", None)
    return not status or status in RETRYABLE_STATUSES


class StatusReporter:
    """Coalesces progress updates and patches them from a daemon thread."""

    # How long `close` may spend landing the last status: the whole FINAL_PATCH_S after a run
    # that ended well; less after one that failed or was stopped (SIGTERM, OOM), whose pod's
    # grace period was planned for its checkpoint and whose exit code must reach the Job first.
    AFTER_SUCCESS_S = FINAL_PATCH_S
    AFTER_FAILURE_S = 15.0

    def __init__(self, job_name: str, namespace: str, api: Any, interval: float = 10.0) -> None:
        self.job_name = job_name
        self.namespace = namespace
        self.interval = interval
        self._api = api
        self._pending: dict[str, Any] = {}
        self._due = False
        self._last_sent = 0.0
        self._closed = False
        self._deadline = 0.0
        self._answered = False  # whether any patch got an HTTP answer in this run
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

    def model_fingerprint(self, identity: str) -> None:
        """Sent at once: a ModelServer compares its adapters' bases by it."""
        with self._wake:
            self._pending["modelFingerprint"] = identity
            self._due = True
            self._wake.notify()

    def sample(self, sample: dict[str, Any]) -> None:
        with self._wake:
            self._pending["sample"] = sample
            self._due = True
            self._wake.notify()

    def evaluation(self, evaluation: dict[str, Any]) -> None:
        """status.evaluation (the base's and the tuned model's figures), sent at once."""
        with self._wake:
            self._pending["evaluation"] = evaluation
            self._due = True
            self._wake.notify()

    def close(self, timeout: float = FINAL_PATCH_S) -> None:
        """Send what is pending, retried until it lands or `timeout` has passed, then stop;
        never waits longer than `timeout`."""
        with self._wake:
            self._closed = True
            self._due = True
            self._deadline = time.monotonic() + timeout
            self._wake.notify()
        self._thread.join(timeout)

    def _loop(self) -> None:
        backoff = RETRY_FIRST_S
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
            if self._send(body):
                backoff = RETRY_FIRST_S
            elif self._again(body, backoff):
                backoff = min(2 * backoff, RETRY_MAX_S)

    def _again(self, body: dict[str, Any], backoff: float) -> bool:
        """After a retryable failure: `body` goes back under what came since. While training it
        waits for the next patch; once closed, it is sent again after `backoff` (the last try
        sooner, to fit) while the deadline leaves room for a try (True), else dropped, said once."""
        with self._wake:
            self._pending = {**body, **self._pending}
            if not self._closed:
                return False
            wait = min(backoff, self._deadline - MIN_TRY_S - time.monotonic())
            if wait < 0 or not self._answered:
                why = "before the reporter's deadline" if self._answered else "(the API server never answered)"
                log.warning("status: the last status did not land %s; dropped", why)
                self._pending = {}
                return False
            self._wake.wait(wait)
            self._due = True
            return True

    def _send(self, status: dict[str, Any]) -> bool:
        """True when sent, or failed for good (dropped); False when worth sending again."""
        self._last_sent = time.monotonic()
        timeout: float = REQUEST_TIMEOUT_S
        if self._closed:  # a try after close ends by the deadline
            timeout = max(MIN_TRY_S / 2, min(timeout, self._deadline - self._last_sent - MIN_TRY_S / 2))
        try:
            self._api.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                self.job_name,
                {"status": status},
                _content_type=MERGE_PATCH,
                _request_timeout=timeout,
            )
            self.sent += 1
            self._answered = True
            return True
        except Exception as exc:  # unreachable, forbidden, deleted: log and keep training
            self.failed += 1
            self._answered = self._answered or bool(getattr(exc, "status", None))
            log.warning("status patch failed (training goes on): %s", str(exc).splitlines()[0] if str(exc) else exc)
            return not _retryable(exc)

"""The upload pod's life as `ftjob upload` sees it: find or start it, wait until it answers, remove it.

An upload killed mid-way leaves its pod running; the next upload to the same claim finds it by
name and reuses it when it runs this CLI's receiver, else replaces it. The files already on the
claim do not depend on the pod: a new pod resumes from them just as well.
"""

from __future__ import annotations

import random
import secrets
import time
from dataclasses import dataclass
from typing import Any

from .errors import CliError
from .kube import Cluster, api_errors
from .pod_proxy import PodProxy
from .upload_pod import ANNOTATION_RECEIVER, TOKEN_ENV, pod_name, receiver_digest, receiver_source, upload_pod

POLL_SECONDS = 0.25
# Ports the receiver picks from: pods on the local control plane share the host's network, so
# two uploads at once must not both want one port; on a real cluster any port would do.
PORTS = range(20000, 30000)
IDLE_SECONDS = 600
GONE_SECONDS = 60.0


@dataclass(frozen=True)
class UploadTarget:
    claim: str
    image: str
    start_timeout: float


def _get(cluster: Cluster, name: str) -> Any | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return cluster.core().read_namespaced_pod(name, cluster.namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        with api_errors(cluster, f"pod {name}"):
            raise


def _reusable(pod: Any, image: str) -> bool:
    annotations = pod.metadata.annotations or {}
    return (
        pod.metadata.deletion_timestamp is None
        and pod.status.phase in ("Pending", "Running")
        and annotations.get(ANNOTATION_RECEIVER) == receiver_digest(receiver_source())
        and pod.spec.containers[0].image == image
    )


def _proxy(cluster: Cluster, pod: Any) -> PodProxy:
    container = pod.spec.containers[0]
    token = next((e.value for e in container.env or [] if e.name == TOKEN_ENV), "")
    return PodProxy(cluster, pod.metadata.name, int(container.ports[0].container_port), token)


def _ended(pod: Any) -> str:
    """Why a pod that should be running is not: its container's end, else the pod's message."""
    for status in pod.status.container_statuses or []:
        state = status.state
        if state and state.terminated:
            ended = state.terminated
            return f"{ended.reason or 'exited'} (exit code {ended.exit_code}): {(ended.message or '').strip()}".rstrip(
                ": "
            )
    return " ".join(str(pod.status.message or pod.status.reason or pod.status.phase).split())


def _waiting(pod: Any) -> str:
    """Why a pod is still Pending: not scheduled (the scheduler's message), or its container's wait."""
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status != "True":
            return " ".join(str(condition.message or condition.reason).split())
    for status in pod.status.container_statuses or []:
        if status.state and status.state.waiting:
            waiting = status.state.waiting
            return " ".join(f"{waiting.reason}: {waiting.message or ''}".split()).rstrip(":")
    return "still Pending"


def delete_pod(cluster: Cluster, name: str, wait: bool = False) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        cluster.core().delete_namespaced_pod(name, cluster.namespace, grace_period_seconds=1)
    except ApiException as exc:
        if exc.status != 404:
            with api_errors(cluster, f"pod {name}"):
                raise
    deadline = time.monotonic() + GONE_SECONDS
    while wait and _get(cluster, name) is not None:
        if time.monotonic() > deadline:
            raise CliError(f"upload pod {name} from an earlier upload is still being deleted; try again shortly")
        time.sleep(POLL_SECONDS)


def _create(cluster: Cluster, target: UploadTarget) -> Any:
    body = upload_pod(target.claim, random.choice(PORTS), secrets.token_hex(16), target.image, IDLE_SECONDS)
    with api_errors(cluster, f"pod {body['metadata']['name']}"):
        return cluster.core().create_namespaced_pod(cluster.namespace, body)


def _wait_running(cluster: Cluster, name: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        pod = _get(cluster, name)
        if pod is None:
            raise CliError(f"upload pod {name} was deleted while starting")
        if pod.status.phase == "Running":
            return pod
        if pod.status.phase in ("Succeeded", "Failed"):
            raise CliError(f"upload pod {name} ended {pod.status.phase}: {_ended(pod)}")
        if time.monotonic() > deadline:
            raise CliError(f"upload pod {name} did not start within {timeout:g} s: {_waiting(pod)}")
        time.sleep(POLL_SECONDS)


def _wait_answering(cluster: Cluster, proxy: PodProxy, timeout: float) -> None:
    """Running is not listening yet; the proxy answers 503 until the receiver's socket is open."""
    deadline = time.monotonic() + timeout
    while True:
        reply = proxy.call("GET", "ping")
        if reply.status == 200:
            return
        pod = _get(cluster, proxy.pod)
        if pod is not None and pod.status.phase in ("Succeeded", "Failed"):
            raise CliError(f"upload pod {proxy.pod} ended {pod.status.phase}: {_ended(pod)}")
        # Only "cannot reach it yet" (5xx) is worth waiting out; e.g. 400 "address not allowed" is not.
        if reply.status < 500 or time.monotonic() > deadline:
            raise CliError(f"upload pod {proxy.pod} runs but does not answer through the API server: {reply.error}")
        time.sleep(POLL_SECONDS)


def check_claim(cluster: Cluster, claim: str) -> None:
    with api_errors(cluster, f"persistentvolumeclaim {claim}"):
        cluster.core().read_namespaced_persistent_volume_claim(claim, cluster.namespace)


def open_session(cluster: Cluster, target: UploadTarget) -> tuple[PodProxy, bool]:
    """A proxy to a receiver that answers, and whether its pod was reused."""
    check_claim(cluster, target.claim)
    name = pod_name(target.claim)
    existing = _get(cluster, name)
    reused = existing is not None and _reusable(existing, target.image)
    if existing is not None and not reused:
        delete_pod(cluster, name, wait=True)
    if not reused:
        _create(cluster, target)
    try:
        pod = _wait_running(cluster, name, target.start_timeout)
        proxy = _proxy(cluster, pod)
        _wait_answering(cluster, proxy, target.start_timeout)
    except BaseException:
        delete_pod(cluster, name)
        raise
    return proxy, reused

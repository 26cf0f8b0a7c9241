"""The agent's Node: registered Ready, kept alive with a Lease as a kubelet does."""

import logging
import threading
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.rest import ApiException

from ..nodes import local_node
from .kube import MERGE_PATCH, Kube

log = logging.getLogger("node-agent")

LEASE_SECONDS = 40
LEASE_RENEW_SECONDS = 10
STATUS_EVERY_SECONDS = 60


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_status(node: dict[str, Any], port: int) -> dict[str, Any]:
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    healthy = {
        "MemoryPressure": ("KubeletHasSufficientMemory", "False"),
        "DiskPressure": ("KubeletHasNoDiskPressure", "False"),
        "PIDPressure": ("KubeletHasSufficientPID", "False"),
        "Ready": ("KubeletReady", "True"),
    }
    return {
        **node["status"],
        "conditions": [
            {"type": kind, "status": value, "reason": reason, "message": "node agent", "lastHeartbeatTime": stamp,
             "lastTransitionTime": stamp}
            for kind, (reason, value) in healthy.items()
        ],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": "localhost"}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        "nodeInfo": {
            "architecture": "amd64", "bootID": "", "containerRuntimeVersion": "node-agent://0", "kernelVersion": "",
            "kubeProxyVersion": "", "kubeletVersion": "v1.34.4", "machineID": "", "operatingSystem": "linux",
            "osImage": "node agent (local processes)", "systemUUID": "",
        },
        "phase": "Running",
    }  # fmt: skip


def register(kube: Kube, name: str, port: int) -> dict[str, Any]:
    """Create (or refresh) the Node, Ready; returns it as a plain dict."""
    node = local_node(name)
    try:
        kube.core.create_node(node)
    except ApiException as err:
        if err.status != 409:
            raise
    kube.core.patch_node_status(name, {"status": node_status(node, port)}, _content_type=MERGE_PATCH)
    return node


def _renew_lease(kube: Kube, name: str) -> None:
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": _micro_now()},
    }
    try:
        kube.coordination.patch_namespaced_lease(name, "kube-node-lease", body, _content_type=MERGE_PATCH)
    except ApiException as err:
        if err.status != 404:
            raise
        kube.coordination.create_namespaced_lease("kube-node-lease", body)


def heartbeat(kube: Kube, node: dict[str, Any], port: int, stop: threading.Event) -> None:
    name = node["metadata"]["name"]
    since_status = 0.0
    while not stop.is_set():
        try:
            _renew_lease(kube, name)
            since_status += LEASE_RENEW_SECONDS
            if since_status >= STATUS_EVERY_SECONDS:
                since_status = 0
                kube.core.patch_node_status(name, {"status": node_status(node, port)}, _content_type=MERGE_PATCH)
        except Exception as err:  # keep beating through API restarts
            log.warning("heartbeat failed: %s", err)
        stop.wait(LEASE_RENEW_SECONDS)

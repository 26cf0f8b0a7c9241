"""The agent's calls to the API server, in one place (what the pod runner and node loop need)."""

import base64
import contextlib
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

MERGE_PATCH = "application/merge-patch+json"


class Kube:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api = api_client
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)

    def plain(self, obj: Any) -> Any:
        return self.api.sanitize_for_serialization(obj)

    def lookup(self, kind: str, namespace: str, name: str) -> Mapping[str, str] | None:
        """ConfigMap or Secret data (Secrets decoded), None when the object does not exist."""
        try:
            if kind == "configmap":
                cm = self.core.read_namespaced_config_map(name, namespace)
                data = dict(cm.data or {})
                for key, value in (cm.binary_data or {}).items():
                    data[key] = base64.b64decode(value).decode(errors="replace")
                return data
            secret = self.core.read_namespaced_secret(name, namespace)
            return {k: base64.b64decode(v).decode(errors="replace") for k, v in (secret.data or {}).items()}
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def request_token(
        self, namespace: str, account: str, audience: str | None, expiration: int, pod: Mapping[str, Any]
    ) -> str:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience] if audience else [],
                "expirationSeconds": expiration,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"],
                },
            },
        }
        result = self.core.create_namespaced_service_account_token(account, namespace, body)
        return str(result.status.token)

    def claim_folder(self, namespace: str, claim: str) -> Path | None:
        try:
            pvc = self.core.read_namespaced_persistent_volume_claim(claim, namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        if not pvc.spec.volume_name or (pvc.status and pvc.status.phase != "Bound"):
            return None
        volume = self.core.read_persistent_volume(pvc.spec.volume_name)
        if volume.spec.host_path is not None:
            return Path(volume.spec.host_path.path)
        if volume.spec.local is not None:
            return Path(volume.spec.local.path)
        return None

    def patch_pod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        try:
            self.core.patch_namespaced_pod_status(name, namespace, {"status": status}, _content_type=MERGE_PATCH)
        except ApiException as err:
            if err.status != 404:
                raise

    def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        """What the kubelet does once a terminating pod's containers are gone: delete with grace 0."""
        try:
            self.core.delete_namespaced_pod(
                name, namespace, grace_period_seconds=0, body={"preconditions": {"uid": uid}, "gracePeriodSeconds": 0}
            )
        except ApiException as err:
            if err.status not in (404, 409):
                raise

    def event(self, pod: Mapping[str, Any], kind: str, reason: str, message: str, node: str) -> None:
        meta = pod["metadata"]
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": kind,
            "reason": reason,
            "message": message,
            "source": {"component": "kubelet", "host": node},
            "reportingComponent": "node-agent",
            "reportingInstance": node,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        # Events are best effort, as in the kubelet.
        with contextlib.suppress(ApiException):
            self.core.create_namespaced_event(meta["namespace"], body)

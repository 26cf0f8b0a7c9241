"""The operator's only door to the API server: a few typed calls, errors counted in metrics.

Everything comes back as plain camelCase dicts (as on the wire), so the pure status logic
reads the same shapes in unit tests and in the cluster.
"""

import json
import logging
from collections.abc import Callable
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from finetune_api import contract
from finetune_api.constants import GROUP, KIND, LABEL_JOB, PLURAL, SERVER_KIND, SERVER_PLURAL, VERSION

from .metrics import Metrics

logger = logging.getLogger(__name__)
COMPONENT = "finetune-operator"

Body = dict[str, Any]


def load_config() -> client.ApiClient:
    """In-cluster config in a pod, else the kubeconfig (KUBECONFIG) as kubectl would use."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    configuration = client.Configuration.get_default_copy()
    # A connection for every thread that may call at once: the reconcile workers (reconcile.py)
    # and the resync loop. Past this urllib3 opens and drops a fresh TLS connection per request.
    configuration.connection_pool_maxsize = 24
    return client.ApiClient(configuration)


def describe_error(exc: BaseException) -> str:
    """One line for a log: the API server's own message where there is one."""
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}: {_api_message(exc)}"
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def _webhook_denied(exc: ApiException) -> bool:
    """A validating webhook refused the object itself (e.g. Kueue's on a Job's queue labels):
    403 like a missing permission, but no retry can change the answer, only the spec."""
    return exc.status == 403 and "admission webhook" in _api_message(exc) and "denied the request" in _api_message(exc)


class Conflict(Exception):
    """The object changed since it was read (HTTP 409), or someone else created it first: the
    leader-election Lease's writes (runtime/leader.py) are conditional on what was read."""


class ChildRejected(Exception):
    """The API server refused a child object as invalid (4xx other than conflicts)."""

    def __init__(self, kind: str, name: str, message: str) -> None:
        super().__init__(f"the API server rejected {kind} {name}: {message}")


def _api_message(exc: ApiException) -> str:
    try:
        message = json.loads(exc.body or "{}").get("message")
    except ValueError:
        message = None
    return str(message or exc.reason or exc.status)[:1000]


class Kube:
    def __init__(self, api: client.ApiClient, metrics: Metrics | None = None) -> None:
        self.api = api
        self.metrics = metrics or Metrics()
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.rbac = client.RbacAuthorizationV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.networking = client.NetworkingV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.apps = client.AppsV1Api(api)
        self._create: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
            "ServiceAccount": (self.core.create_namespaced_service_account, self.core.read_namespaced_service_account),
            "PersistentVolumeClaim": (
                self.core.create_namespaced_persistent_volume_claim,
                self.core.read_namespaced_persistent_volume_claim,
            ),
            "Role": (self.rbac.create_namespaced_role, self.rbac.read_namespaced_role),
            "RoleBinding": (self.rbac.create_namespaced_role_binding, self.rbac.read_namespaced_role_binding),
            "Service": (self.core.create_namespaced_service, self.core.read_namespaced_service),
            "Job": (self.batch.create_namespaced_job, self.batch.read_namespaced_job),
            "NetworkPolicy": (
                self.networking.create_namespaced_network_policy,
                self.networking.read_namespaced_network_policy,
            ),
            "Deployment": (self.apps.create_namespaced_deployment, self.apps.read_namespaced_deployment),
        }

    @staticmethod
    def _plain(response: Any) -> Body:
        # Raw responses (`_preload_content=False`): the object exactly as on the wire (RFC 3339
        # times as the server wrote them), and no model objects built only to be turned back.
        result: Body = json.loads(response.data)
        return result

    def _call(self, verb: str, kind: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.metrics.api_requests.labels(verb=verb, kind=kind).inc()
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            self.metrics.api_errors.labels(verb=verb, kind=kind, code=str(exc.status)).inc()
            raise

    def create_or_get(self, body: Body) -> tuple[Body, bool]:
        """Create the object, or return the existing one of that name: (object, created).

        Raises ChildRejected when the API server (or the client's own model) refuses the object
        itself: retrying cannot help, the FineTuneJob's spec has to change.
        """
        kind = body["kind"]
        namespace = body["metadata"]["namespace"]
        create, read = self._create[kind]
        self.metrics.api_requests.labels(verb="create", kind=kind).inc()
        try:
            return self._plain(create(namespace, body, _preload_content=False)), True
        except ApiException as exc:
            if exc.status != 409:
                self.metrics.api_errors.labels(verb="create", kind=kind, code=str(exc.status)).inc()
                if exc.status in (400, 422) or _webhook_denied(exc):
                    raise ChildRejected(kind, body["metadata"]["name"], _api_message(exc)) from exc
                raise
        except (ValueError, TypeError) as exc:
            self.metrics.api_errors.labels(verb="create", kind=kind, code="client").inc()
            raise ChildRejected(kind, body["metadata"]["name"], " ".join(str(exc).split())[:1000]) from exc
        found = self._call("get", kind, read, body["metadata"]["name"], namespace, _preload_content=False)
        return self._plain(found), False

    def get_job(self, namespace: str, name: str) -> Body | None:
        try:
            return self._plain(
                self._call("get", "Job", self.batch.read_namespaced_job, name, namespace, _preload_content=False)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def get_claim(self, namespace: str, name: str) -> Body | None:
        """A PersistentVolumeClaim (the object cache claim a job fetches into), or None."""
        read = self.core.read_namespaced_persistent_volume_claim
        try:
            return self._plain(
                self._call("get", "PersistentVolumeClaim", read, name, namespace, _preload_content=False)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def get_service(self, namespace: str, name: str) -> Body | None:
        """A Service a job's trainer calls (its selector and ports, for the job's NetworkPolicy), or None."""
        read = self.core.read_namespaced_service
        try:
            return self._plain(self._call("get", "Service", read, name, namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_job(self, namespace: str, name: str, patch: Body) -> Body:
        return self._plain(
            self._call("patch", "Job", self.batch.patch_namespaced_job, name, namespace, patch, _preload_content=False)
        )

    def list_pods(self, namespace: str, job: str) -> list[Body]:
        pods = self._call(
            "list",
            "Pod",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=f"{LABEL_JOB}={job}",
            _preload_content=False,
        )
        items: list[Body] = self._plain(pods).get("items") or []
        return items

    def get_finetunejob(self, namespace: str, name: str) -> Body | None:
        try:
            found: Body = self._call(
                "get", KIND, self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name
            )
            return found
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_status(self, namespace: str, name: str, patch: Body) -> Body:
        """Merge-patch the status subresource; the object as the API server now holds it."""
        result: Body = self._call(
            "patch",
            f"{KIND}/status",
            self.custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"status": patch},
        )
        return result

    # --- ModelServers (servers/): few, so read straight from the API server, never cached

    def _get_or_none(self, kind: str, fn: Callable[..., Any], *args: Any) -> Body | None:
        try:
            return self._plain(self._call("get", kind, fn, *args, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def get_server(self, namespace: str, name: str) -> Body | None:
        get = self.custom.get_namespaced_custom_object
        return self._get_or_none(SERVER_KIND, get, GROUP, VERSION, namespace, SERVER_PLURAL, name)

    def patch_server_status(self, namespace: str, name: str, patch: Body) -> Body:
        result: Body = self._call(
            "patch",
            f"{SERVER_KIND}/status",
            self.custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            SERVER_PLURAL,
            name,
            {"status": patch},
        )
        return result

    def get_deployment(self, namespace: str, name: str) -> Body | None:
        return self._get_or_none("Deployment", self.apps.read_namespaced_deployment, name, namespace)

    def apply_deployment(self, body: Body) -> Body:
        """The Deployment as the operator would make it now, by server-side apply: the fields it
        wrote and no longer writes go (a removed toleration), the others' stay (the controller's)."""
        meta = body["metadata"]
        try:
            applied = self._call(
                "patch",
                "Deployment",
                self.apps.patch_namespaced_deployment,
                meta["name"],
                meta["namespace"],
                body,
                field_manager=COMPONENT,
                force=True,
                _content_type="application/apply-patch+yaml",
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status in (400, 422) or _webhook_denied(exc):
                raise ChildRejected("Deployment", meta["name"], _api_message(exc)) from exc
            raise
        return self._plain(applied)

    def claim_exists(self, namespace: str, name: str) -> bool:
        read = self.core.read_namespaced_persistent_volume_claim
        return self._get_or_none("PersistentVolumeClaim", read, name, namespace) is not None

    def list_pods_labelled(self, namespace: str, selector: str) -> list[Body]:
        pods = self._call(
            "list", "Pod", self.core.list_namespaced_pod, namespace, label_selector=selector, _preload_content=False
        )
        items: list[Body] = self._plain(pods).get("items") or []
        return items

    def post_event(self, owner: Body, type_: str, reason: str, message: str) -> None:
        meta = owner["metadata"]
        now = contract.now()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": owner.get("apiVersion"),
                "kind": owner.get("kind") or KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._call("create", "Event", self.core.create_namespaced_event, meta["namespace"], body)
            self.metrics.events_posted.labels(reason=reason).inc()
        except ApiException as exc:
            # An Event is worth less than the reconcile that produced it.
            logger.warning(
                "could not post event %s on %s/%s: HTTP %s", reason, meta["namespace"], meta["name"], exc.status
            )

    # --- the leader-election Lease (runtime/leader.py): short timeouts, a slow answer is a failed try

    LEASE_TIMEOUT_S = 5.0

    def get_lease(self, namespace: str, name: str) -> Body | None:
        try:
            response = self._call(
                "get",
                "Lease",
                self.coordination.read_namespaced_lease,
                name,
                namespace,
                _preload_content=False,
                _request_timeout=self.LEASE_TIMEOUT_S,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return self._plain(response)

    def create_lease(self, namespace: str, body: Body) -> Body:
        return self._lease_write("create", self.coordination.create_namespaced_lease, namespace, body)

    def replace_lease(self, namespace: str, name: str, body: Body) -> Body:
        return self._lease_write("update", self.coordination.replace_namespaced_lease, name, namespace, body)

    def _lease_write(self, verb: str, fn: Callable[..., Any], *args: Any) -> Body:
        self.metrics.api_requests.labels(verb=verb, kind="Lease").inc()
        try:
            response = fn(*args, _preload_content=False, _request_timeout=self.LEASE_TIMEOUT_S)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(f"Lease {verb}: {_api_message(exc)}") from exc
            self.metrics.api_errors.labels(verb=verb, kind="Lease", code=str(exc.status)).inc()
            raise
        return self._plain(response)

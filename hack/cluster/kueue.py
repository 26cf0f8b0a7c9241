"""Kueue on the local control plane: optional, started only by the tests (and demos) that need it.

Kueue's own manifests are used as they ship in its Go module (CRDs, conversion webhook patches,
admission webhook configurations, see binaries.KUEUE), with these adaptations for a control plane
that has no kube-proxy, no kubelet and no cluster DNS:

- The webhook Service `kueue-webhook-service` is of type ExternalName with name 127.0.0.1. The
  API server resolves an ExternalName Service to that name and the port the webhook's
  clientConfig gives, so every `service:` clientConfig of Kueue's manifests reaches the manager
  on 127.0.0.1:<webhook port>, while TLS is still checked against the Service's DNS name, as in a
  real cluster. Only the port (9443 there, a free one here) is rewritten.
- Kueue's internal certificate management stays on: it writes its CA and serving certificate
  into the Secret `kueue-webhook-server-cert` and injects the CA into the webhook configurations
  and CRDs. A kubelet would mount that Secret into the manager's cert folder; here `up` copies it.
- Only the webhooks of the integrations enabled here (batch/v1 Jobs) and of Kueue's own kinds are
  registered: a pod or Deployment webhook with failurePolicy Fail would stand between every
  other test and the API server.
- The batch/v1 Job webhooks see only Jobs labelled `kueue.x-k8s.io/queue-name` (an
  objectSelector): Kueue manages no other Job here, and its webhook would otherwise look up the
  owners of every other test's Jobs.
- The manager runs as a local process with the admin kubeconfig, leader election off, metrics
  off, the health probe and webhook server on 127.0.0.1, and the visibility API (an aggregated
  API server that writes certificates under /visibility) off.

Several test sessions of one checkout share one Kueue the way they share the cluster: each
registers, and the last to leave stops a Kueue that a session started. `down` removes the webhook
configurations before stopping the manager, so a cluster without Kueue never has a webhook that
nobody answers; `clean_if_dead` does the same for a manager that died with its session.
"""

import base64
import contextlib
import copy
import json
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from . import binaries, processes
from .control_plane import http_ok, wait_until
from .layout import Layout

NAME = "kueue"
NAMESPACE = "kueue-system"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
WEBHOOK_SERVICE = "kueue-webhook-service"
WEBHOOK_SECRET = "kueue-webhook-server-cert"
MUTATING = "kueue-mutating-webhook-configuration"
VALIDATING = "kueue-validating-webhook-configuration"
# The name the API server dials for every `service:` clientConfig of Kueue's (see the docstring).
LOCAL_ADDRESS = "127.0.0.1"
FRAMEWORKS = ("batch/job",)
# Webhooks whose rules touch only these groups are registered; the rest belong to integrations
# that are off here (pods, Deployments, StatefulSets, Kubeflow, Ray...).
WEBHOOK_GROUPS = frozenset({"batch", "kueue.x-k8s.io"})
CRD_GROUP = "kueue.x-k8s.io"
READY_TIMEOUT_S = 180


def _say(message: str) -> None:
    print(f"cluster: kueue: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class KueuePorts:
    webhook: int
    health: int

    @classmethod
    def free(cls) -> "KueuePorts":
        with contextlib.ExitStack() as stack:
            ports = []
            for _ in range(2):
                sock = stack.enter_context(socket.socket())
                sock.bind((LOCAL_ADDRESS, 0))
                ports.append(int(sock.getsockname()[1]))
        return cls(*ports)


@dataclass(frozen=True)
class KueuePaths:
    """Where one cluster keeps its Kueue's state (gone with the cluster's `down`)."""

    root: Path

    @classmethod
    def of(cls, layout: Layout) -> "KueuePaths":
        return cls(layout.root / NAME)

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def certs(self) -> Path:
        return self.root / "certs"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def sessions(self) -> Path:
        return self.root / "sessions"

    @property
    def session_owned(self) -> Path:
        return self.root / "session-owned"


# --- manifests (pure) -------------------------------------------------------------------------


def _documents(folder: Path) -> Iterator[dict[str, Any]]:
    for path in sorted(folder.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document.get("kind"):
                yield document


def _service_ref(port: int, path: str) -> dict[str, Any]:
    return {"namespace": NAMESPACE, "name": WEBHOOK_SERVICE, "path": path, "port": port}


def crds(manifests: Path, port: int) -> list[dict[str, Any]]:
    """Kueue's CRDs, with its conversion webhook patches applied (kustomize's job upstream)."""
    kustomization = yaml.safe_load((manifests / "crd-kustomization" / "kustomization.yaml").read_text())
    conversions = {}
    for entry in kustomization.get("patches") or []:
        patch = yaml.safe_load((manifests / "crd-kustomization" / entry["path"]).read_text())
        conversion = (patch.get("spec") or {}).get("conversion") or {}
        if conversion.get("strategy") == "Webhook":
            conversions[patch["metadata"]["name"]] = conversion
    out = []
    for shipped in _documents(manifests / "crd"):
        crd = copy.deepcopy(shipped)
        conversion = conversions.get(crd["metadata"]["name"])
        if conversion is not None:
            webhook = copy.deepcopy(conversion["webhook"])
            webhook["clientConfig"] = {"service": _service_ref(port, webhook["clientConfig"]["service"]["path"])}
            crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": webhook}
        out.append(crd)
    return out


def _kept(webhook: dict[str, Any]) -> bool:
    groups = {group for rule in webhook.get("rules") or [] for group in rule.get("apiGroups") or []}
    return bool(groups) and groups <= WEBHOOK_GROUPS


def _on_jobs(webhook: dict[str, Any]) -> bool:
    return any(
        "batch" in (rule.get("apiGroups") or []) and "jobs" in (rule.get("resources") or [])
        for rule in webhook.get("rules") or []
    )


def webhook_configurations(manifests: Path, port: int, ca_bundle: bytes | None) -> list[dict[str, Any]]:
    """Kueue's admission webhooks for the enabled integrations, named as its cert manager expects."""
    names = {"MutatingWebhookConfiguration": MUTATING, "ValidatingWebhookConfiguration": VALIDATING}
    out = []
    for doc in _documents(manifests / "webhook"):
        if doc["kind"] not in names:
            continue
        webhooks = []
        for shipped in doc.get("webhooks") or []:
            if not _kept(shipped):
                continue
            webhook = copy.deepcopy(shipped)
            path = webhook["clientConfig"]["service"]["path"]
            client_config: dict[str, Any] = {"service": _service_ref(port, path)}
            if ca_bundle:
                client_config["caBundle"] = base64.b64encode(ca_bundle).decode()
            webhook["clientConfig"] = client_config
            if _on_jobs(webhook):
                # Only Jobs that ask for a queue: Kueue's Job webhook otherwise looks up every
                # Job's owners and answers for Jobs it will never manage (manageJobsWithoutQueueName
                # is off), which would put it in front of every other test's Jobs.
                webhook["objectSelector"] = {"matchExpressions": [{"key": QUEUE_LABEL, "operator": "Exists"}]}
            webhooks.append(webhook)
        out.append({**doc, "metadata": {"name": names[doc["kind"]]}, "webhooks": webhooks})
    return out


def webhook_service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": WEBHOOK_SERVICE, "namespace": NAMESPACE},
        "spec": {"type": "ExternalName", "externalName": LOCAL_ADDRESS},
    }


def configuration(paths: KueuePaths, ports: KueuePorts) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for the local manager."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"{LOCAL_ADDRESS}:{ports.health}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": LOCAL_ADDRESS, "port": ports.webhook, "certDir": str(paths.certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": WEBHOOK_SERVICE,
            "webhookSecretName": WEBHOOK_SECRET,
        },
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": list(FRAMEWORKS)},
        "featureGates": {"VisibilityOnDemand": False},
    }


# --- the API calls --------------------------------------------------------------------------


def _api(layout: Layout) -> Any:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(str(layout.kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration)


def _create_or_replace(create: Any, read: Any, replace: Any, body: dict[str, Any], *scope: str) -> None:
    from kubernetes.client.rest import ApiException

    try:
        create(*scope, body)
    except ApiException as err:
        if err.status != 409:
            raise
        name = body["metadata"]["name"]
        version = read(name, *scope).metadata.resource_version
        replace(name, *scope, {**body, "metadata": {**body["metadata"], "resourceVersion": version}})


def _install(api: Any, manifests: Path, ports: KueuePorts) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(api)
    ext = client.ApiextensionsV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    except ApiException as err:
        if err.status != 409:
            raise
    try:
        # Empty, as Kueue's config/components/internalcert ships it: its cert manager fills it.
        core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": WEBHOOK_SECRET}})
    except ApiException as err:
        if err.status != 409:
            raise
    _create_or_replace(
        core.create_namespaced_service,
        core.read_namespaced_service,
        core.replace_namespaced_service,
        webhook_service(),
        NAMESPACE,
    )
    wanted = crds(manifests, ports.webhook)
    for crd in wanted:
        _create_or_replace(
            ext.create_custom_resource_definition,
            ext.read_custom_resource_definition,
            ext.replace_custom_resource_definition,
            crd,
        )

    def established() -> bool:
        for crd in wanted:
            found = ext.read_custom_resource_definition(crd["metadata"]["name"])
            if not any(c.type == "Established" and c.status == "True" for c in found.status.conditions or []):
                return False
        return True

    wait_until("Kueue's CRDs Established", established, 60)


def _secret_files(api: Any) -> dict[str, bytes] | None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        secret = client.CoreV1Api(api).read_namespaced_secret(WEBHOOK_SECRET, NAMESPACE)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    data = secret.data or {}
    if not {"tls.crt", "tls.key", "ca.crt"} <= set(data):
        return None
    return {key: base64.b64decode(value) for key, value in data.items()}


def _mount_secret(api: Any, paths: KueuePaths) -> bool:
    """What a kubelet does for the manager's Secret volume: its keys as files in the cert folder."""
    files = _secret_files(api)
    if files is None:
        return False
    paths.certs.mkdir(parents=True, exist_ok=True)
    for key in ("tls.crt", "tls.key", "ca.crt"):
        target = paths.certs / key
        if not target.exists() or target.read_bytes() != files[key]:
            staged = target.with_suffix(".tmp")
            staged.write_bytes(files[key])
            staged.chmod(0o600)
            staged.replace(target)
    return True


def _register_webhooks(api: Any, manifests: Path, ports: KueuePorts, ca: bytes) -> None:
    from kubernetes import client

    admission = client.AdmissionregistrationV1Api(api)
    calls = {
        "MutatingWebhookConfiguration": (
            admission.create_mutating_webhook_configuration,
            admission.read_mutating_webhook_configuration,
            admission.replace_mutating_webhook_configuration,
        ),
        "ValidatingWebhookConfiguration": (
            admission.create_validating_webhook_configuration,
            admission.read_validating_webhook_configuration,
            admission.replace_validating_webhook_configuration,
        ),
    }
    for body in webhook_configurations(manifests, ports.webhook, ca):
        _create_or_replace(*calls[body["kind"]], body)


def _remove_webhooks(api: Any) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    admission = client.AdmissionregistrationV1Api(api)
    for delete, name in (
        (admission.delete_mutating_webhook_configuration, MUTATING),
        (admission.delete_validating_webhook_configuration, VALIDATING),
    ):
        try:
            delete(name)
        except ApiException as err:
            if err.status != 404:
                raise


def _webhooks_answer(api: Any) -> bool:
    """A dry-run ResourceFlavor create goes through Kueue's own webhooks: TLS and routing work."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    flavor = {"apiVersion": f"{CRD_GROUP}/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "probe"}}
    try:
        client.CustomObjectsApi(api).create_cluster_custom_object(
            CRD_GROUP, "v1beta2", "resourceflavors", flavor, dry_run="All"
        )
    except ApiException as err:
        return err.status == 409  # one exists already: admission ran
    return True


# --- lifecycle ----------------------------------------------------------------------------------


def running(layout: Layout) -> bool:
    paths = KueuePaths.of(layout)
    if not (paths.state.is_file() and processes.alive(layout, NAME)):
        return False
    ports = KueuePorts(**json.loads(paths.state.read_text()))
    return http_ok(f"http://{LOCAL_ADDRESS}:{ports.health}/readyz")


def up(layout: Layout) -> None:
    """Start Kueue against the running cluster (call with the cluster's lock held)."""
    if running(layout):
        return
    started = time.monotonic()
    folder = binaries.ensure_component(layout, binaries.KUEUE)
    manifests = folder / binaries.KUEUE_MANIFESTS
    paths = KueuePaths.of(layout)
    api = _api(layout)
    _stop(layout, api)
    paths.root.mkdir(parents=True, exist_ok=True)
    ports = KueuePorts.free()
    paths.state.write_text(json.dumps(asdict(ports)))
    paths.config.write_text(yaml.safe_dump(configuration(paths, ports)))
    _install(api, manifests, ports)
    _mount_secret(api, paths)  # a Secret from an earlier run in this cluster: reused as is
    argv = [str(folder / NAME), f"--config={paths.config}", f"--kubeconfig={layout.kubeconfig}"]
    processes.start(layout, NAME, argv)

    def ready() -> bool:
        _mount_secret(api, paths)
        return http_ok(f"http://{LOCAL_ADDRESS}:{ports.health}/readyz")

    def alive() -> bool:
        return processes.alive(layout, NAME)

    try:
        wait_until("Kueue ready", ready, READY_TIMEOUT_S, alive)
        _register_webhooks(api, manifests, ports, (paths.certs / "ca.crt").read_bytes())
        wait_until("Kueue's webhooks answering", lambda: _webhooks_answer(api), 60, alive)
    except BaseException:
        _print_log_tail(layout)
        _stop(layout, api)
        raise
    _say(f"up in {time.monotonic() - started:.1f}s (webhooks on {LOCAL_ADDRESS}:{ports.webhook})")


def _print_log_tail(layout: Layout, lines: int = 30) -> None:
    log = layout.logs / f"{NAME}.log"
    if log.is_file():
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        print(f"--- {log.name} (last {len(tail)} lines)", *tail, sep="\n", file=sys.stderr)


def _stop(layout: Layout, api: Any) -> None:
    """Webhook configurations first (nobody may be left calling a stopped manager), then the process."""
    _remove_webhooks(api)
    processes.stop(layout, NAME)
    paths = KueuePaths.of(layout)
    paths.state.unlink(missing_ok=True)


def down(layout: Layout) -> None:
    """Stop Kueue; its CRDs and objects stay (they go with the cluster)."""
    if not layout.kubeconfig.is_file():
        processes.stop(layout, NAME)
        return
    _stop(layout, _api(layout))
    paths = KueuePaths.of(layout)
    paths.session_owned.unlink(missing_ok=True)


def clean_if_dead(layout: Layout) -> None:
    """A manager that died with its session leaves webhooks nobody answers: remove them."""
    paths = KueuePaths.of(layout)
    if paths.state.is_file() and not processes.alive(layout, NAME):
        _say("the manager is gone; removing its webhook configurations")
        down(layout)

"""What a ModelServer is made of: a Deployment of llama-server, its Service and, where the
platform turned trainer policies on, its NetworkPolicy. Pure: the spec, the files it serves
(finetune_api.served_files, already checked) and the settings in, plain API dicts out.

The pod is a trainer pod's kind of pod: the same placement (GPU product label, the chart's GPU
tolerations), the same Pod Security `restricted` contexts, the same uid. It differs where a server
differs: no ServiceAccount token at all (llama-server talks to no API), every claim read-only, a
readiness probe on llama-server's /health (503 while the model loads), and a short pause before
SIGTERM (`preStop: sleep`) so the Service stops sending a pod requests before it stops answering.
The fence (charts/finetune-operator/files/operator-fence-policy.yaml, finetune-fence-deployments)
admits this shape alone.

llama-server listens on the pod's own address (`--host $(POD_IP)`), not 0.0.0.0: on a real node
the two are the same pod network namespace; on the local cluster's node agent, whose pods share
the host's, it is what lets a new pod listen beside the old one during a roll.
"""

import math
from dataclasses import dataclass
from typing import Any, Final

from finetune_api.constants import (
    API_VERSION,
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    LABEL_SERVER,
    MANAGED_BY,
    SERVER_KIND,
)
from finetune_api.served_files import CLAIMS_MOUNT, Resolution
from finetune_api.server_spec import SERVER_PORT, SERVER_PORT_NAME, ModelServerSpec

from .. import quantities
from ..settings import Settings
from .job import pod_placement, security_contexts

COMPONENT_SERVER: Final = "server"
CONTAINER: Final = "server"
# The serving image's entrypoint (serving_image/Dockerfile); the fence admits this command alone.
COMMAND: Final = ("llama-server",)
POD_IP_ENV: Final = "POD_IP"
TMP_MOUNT: Final = "/tmp"
# Every folder a server container mounts something at; the fence admits no other.
MOUNT_PATHS: Final = (TMP_MOUNT, CLAIMS_MOUNT)
HEALTH_PATH: Final = "/health"
# Seconds a stopping pod keeps answering while the Service's endpoints drop it (preStop sleep).
DRAIN_SECONDS: Final = 5
GRACE_SECONDS: Final = 30
TMP_SIZE: Final = "1Gi"


@dataclass(frozen=True)
class ServerOwner:
    """The ModelServer a child belongs to: enough for an ownerReference and the names."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        # No blockOwnerDeletion, as for a job's children: the garbage collector deletes them.
        return {"apiVersion": API_VERSION, "kind": SERVER_KIND, "name": self.name, "uid": self.uid, "controller": True}

    @property
    def child_name(self) -> str:
        """The Deployment's, the Service's and the NetworkPolicy's name: a job of the same name
        keeps its own (a job of several nodes has a Service named as the job)."""
        return f"{self.name}-server"

    @property
    def endpoint(self) -> str:
        return f"http://{self.child_name}.{self.namespace}.svc:{SERVER_PORT}"


def server_labels(name: str) -> dict[str, str]:
    return {LABEL_SERVER: name, LABEL_COMPONENT: COMPONENT_SERVER, LABEL_MANAGED_BY: MANAGED_BY}


def _metadata(owner: ServerOwner) -> dict[str, Any]:
    return {
        "name": owner.child_name,
        "namespace": owner.namespace,
        "labels": server_labels(owner.name),
        "ownerReferences": [owner.reference()],
    }


def _threads(cpu: str | None) -> list[str]:
    """llama.cpp's threads: the pod's CPUs where it has a limit (its default, every core of the
    node, would fight the limit's throttling)."""
    if not cpu:
        return []
    return ["--threads", str(max(1, math.ceil(quantities.to_bytes(cpu))))]


def adapter_args(files: Resolution) -> list[str]:
    """Every adapter at scale 0, so a request that names none is answered by the base and one that
    names its own (`lora: [{id, scale}]`) by that adapter alone. The pinned llama.cpp gives a
    request without `lora` each adapter's load-time scale, 1.0 with `--lora` even under
    `--lora-init-without-apply` (hence `--lora-scaled PATH:0`), and reuses a slot's cached prompt
    computed under another request's adapters, which changes the answer (hence `--no-cache-prompt`,
    where there are adapters): both measured by the serving tests."""
    if not files.adapters:
        return []
    scaled = ",".join(f"{adapter.pod_path}:0" for adapter in files.adapters)
    return ["--lora-scaled", scaled, "--lora-init-without-apply", "--no-cache-prompt"]


def server_args(name: str, spec: ModelServerSpec, files: Resolution, settings: Settings) -> list[str]:
    """llama-server's arguments: the base, the adapters (adapter_args), the pod's address and
    port, context, slots, metrics."""
    assert files.base is not None
    args = ["--model", files.base.pod_path, *adapter_args(files)]
    args += [
        "--host",
        f"$({POD_IP_ENV})",
        "--port",
        str(SERVER_PORT),
        "--ctx-size",
        str(spec.context_size),
        "--parallel",
        str(spec.parallel),
        "--n-gpu-layers",
        "all" if spec.resources.gpus > 0 else "0",
        "--alias",
        name,
        "--metrics",
        "--no-webui",
        *_threads(spec.resources.cpu or settings.default_cpu),
    ]
    return args


def _resources(spec: ModelServerSpec, settings: Settings) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    cpu = spec.resources.cpu or settings.default_cpu
    memory = spec.resources.memory or settings.default_memory
    if cpu:
        limits["cpu"] = cpu
    if memory:
        limits["memory"] = memory
    if spec.resources.gpus > 0:
        limits[settings.gpu_resource] = str(spec.resources.gpus)
    requests = dict(limits)
    limits["ephemeral-storage"] = TMP_SIZE
    return {"limits": limits, "requests": requests}


def _volumes(files: Resolution) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each claim once, read-only at CLAIMS_MOUNT/<claim>, and a small /tmp."""
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE}}]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": TMP_MOUNT}]
    for index, claim in enumerate(files.claims):
        volume = f"claim-{index}"
        volumes.append({"name": volume, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": volume, "mountPath": f"{CLAIMS_MOUNT}/{claim}", "readOnly": True})
    return volumes, mounts


def container(name: str, spec: ModelServerSpec, files: Resolution, settings: Settings) -> dict[str, Any]:
    volumes_mounts = _volumes(files)[1]
    _, security = security_contexts(settings)
    return {
        "name": CONTAINER,
        "image": spec.image or settings.serving_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": list(COMMAND),
        "args": server_args(name, spec, files, settings),
        "env": [
            {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "HOME", "value": TMP_MOUNT},
        ],
        "ports": [{"name": SERVER_PORT_NAME, "containerPort": SERVER_PORT, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": HEALTH_PATH, "port": SERVER_PORT_NAME, "scheme": "HTTP"},
            "periodSeconds": 2,
            "timeoutSeconds": 2,
            "failureThreshold": 2,
        },
        "lifecycle": {"preStop": {"sleep": {"seconds": DRAIN_SECONDS}}},
        "volumeMounts": volumes_mounts,
        "resources": _resources(spec, settings),
        "securityContext": security,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def deployment(owner: ServerOwner, spec: ModelServerSpec, files: Resolution, settings: Settings) -> dict[str, Any]:
    pod_security, _ = security_contexts(settings)
    volumes, _ = _volumes(files)
    pod_spec: dict[str, Any] = {
        # llama-server calls no API: no token is mounted, and no Service's address is put in its env.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security,
        "containers": [container(owner.name, spec, files, settings)],
        "volumes": volumes,
        "terminationGracePeriodSeconds": GRACE_SECONDS,
        **pod_placement(spec.placement, spec.resources.gpus, spec.resources.gpu_product, settings),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": {LABEL_SERVER: owner.name}},
            # A new pod is ready before an old one goes: no request is refused during a roll,
            # and a roll that finds no GPU for the new pod leaves the old ones serving.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "revisionHistoryLimit": 2,
            "template": {"metadata": {"labels": server_labels(owner.name)}, "spec": pod_spec},
        },
    }


def service(owner: ServerOwner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner),
        "spec": {
            "type": "ClusterIP",
            "selector": {LABEL_SERVER: owner.name},
            "ports": [
                {"name": SERVER_PORT_NAME, "port": SERVER_PORT, "targetPort": SERVER_PORT_NAME, "protocol": "TCP"}
            ],
        },
    }


def network_policy(owner: ServerOwner) -> dict[str, Any]:
    """The server's pods answer on their port, to whoever the cluster lets reach it (the team's
    clients, the API server's service proxy, Prometheus), and reach nothing: llama-server reads
    local files and calls out to no one."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(owner),
        "spec": {
            "podSelector": {"matchLabels": server_labels(owner.name)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": SERVER_PORT}]}],
            "egress": [],
        },
    }


def children(owner: ServerOwner, spec: ModelServerSpec, files: Resolution, settings: Settings) -> list[dict[str, Any]]:
    """In creation order: the NetworkPolicy first (no pod of it runs unfenced), the Service, the
    Deployment last."""
    policy = [network_policy(owner)] if settings.trainer_network is not None else []
    return [*policy, service(owner), deployment(owner, spec, files, settings)]

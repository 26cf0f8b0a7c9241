"""The operator fence around what it may now make for ModelServers, proven on the real API server
with the operator's own ServiceAccount token (never admin): a stolen token cannot run another
image, mount a claim writable, give a pod a token, reach storage of another namespace, serve a
claim's files (`--path`), open its pods wider or write outside the team namespaces; and what the
builders really send is admitted. Dry runs: admission runs in full and nothing is stored (but the
one Deployment an update is tried on)."""

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from finetune_api.constants import API_VERSION, SERVER_KIND, SERVER_PLURAL
from finetune_api.served_files import Resolution, Served
from finetune_api.server_spec import ModelServerSpec
from finetune_operator.builders import model_server as builder
from finetune_operator.settings import SETTINGS, Settings, from_env
from tests.fixtures.cluster import Cluster, token_client
from tests.support.harness import OPERATOR_SA, SYSTEM_NAMESPACE, TRAINER_NETWORK, operator_identity, wait_for

pytestmark = pytest.mark.cluster

SPEC = ModelServerSpec.model_validate(
    {"base": {"pvc": {"claimName": "models", "path": "base.gguf"}}, "adapters": [{"job": "a"}]}
)
FILES = Resolution(
    base=Served("spec.base.pvc", "models", "base.gguf"),
    adapters=[Served("spec.adapters[0].job", "outputs", "a/gguf/adapter-f16.gguf", job="a", id=0)],
)
NETWORK = from_env({SETTINGS["trainer_network"].env: json.dumps(TRAINER_NETWORK)})


class Fenced:
    """The operator's token in one namespace, and a ModelServer there to own the children."""

    def __init__(self, api: client.ApiClient, namespace: str, owner: builder.ServerOwner) -> None:
        self.namespace = namespace
        self.owner = owner
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)
        self.networking = client.NetworkingV1Api(api)

    def refusal(self, create: Callable[..., Any], body: dict[str, Any], namespace: str | None = None) -> str | None:
        """None when admitted (dry run); else the API server's message."""
        try:
            create(namespace or self.namespace, body, dry_run="All")
        except ApiException as exc:
            assert exc.status in (403, 422), f"unexpected HTTP {exc.status}: {exc.body}"
            return str(exc.body)
        return None

    def deployment(self, settings: Settings = NETWORK) -> dict[str, Any]:
        return builder.deployment(self.owner, SPEC, FILES, settings)

    def children(self) -> list[dict[str, Any]]:
        return builder.children(self.owner, SPEC, FILES, NETWORK)


@pytest.fixture(scope="module")
def fenced(cluster: Cluster, kube: client.ApiClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fenced]:
    core = client.CoreV1Api(kube)
    namespace = f"fence-servers-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace, "labels": {"finetune.dev/test": "true"}}})
    operator_identity(kube, cluster.kubeconfig, tmp_path_factory.mktemp("fence-servers"))
    made = client.CustomObjectsApi(kube).create_namespaced_custom_object(
        "finetune.dev",
        "v1alpha1",
        namespace,
        SERVER_PLURAL,
        {"apiVersion": API_VERSION, "kind": SERVER_KIND, "metadata": {"name": "chat"}, "spec": SPEC.model_dump()},
    )
    owner = builder.ServerOwner("chat", namespace, made["metadata"]["uid"])
    fenced = Fenced(token_client(cluster, core, SYSTEM_NAMESPACE, OPERATOR_SA), namespace, owner)
    # A policy takes a moment to reach the admission plugin: wait until the fence refuses an image.
    other = fenced.deployment(Settings(serving_image="docker.io/x/y:1", allowed_serving_images=("docker.io/x/y",)))
    wait_for(lambda: "rule deployment-image" in (fenced.refusal(fenced.apps.create_namespaced_deployment, other) or ""),
             60, "the fence")  # fmt: skip
    yield fenced
    core.delete_namespace(namespace, propagation_policy="Background")


def _assert_rule(message: str | None, rule: str) -> None:
    assert message is not None, f"admitted, but rule {rule} should have refused it"
    assert f"finetune-operator fence, rule {rule}:" in message, message


def _pod(deployment: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = _pod(deployment)["containers"][0]
    return container


def _create(fenced: Fenced, kind: str) -> Callable[..., Any]:
    return {
        "Deployment": fenced.apps.create_namespaced_deployment,
        "Service": fenced.core.create_namespaced_service,
        "NetworkPolicy": fenced.networking.create_namespaced_network_policy,
    }[kind]


def test_what_the_builders_send_is_admitted(fenced: Fenced) -> None:
    for child in fenced.children():
        assert fenced.refusal(_create(fenced, child["kind"]), child) is None, child["kind"]
    on_cpu = builder.deployment(fenced.owner, SPEC.model_copy(update={"adapters": []}), FILES, Settings())
    assert fenced.refusal(fenced.apps.create_namespaced_deployment, on_cpu) is None


def test_another_image_is_refused_on_create_and_on_update(fenced: Fenced, kube: client.ApiClient) -> None:
    made = fenced.deployment()
    _container(made)["image"] = "docker.io/evil/miner:latest"
    message = fenced.refusal(fenced.apps.create_namespaced_deployment, made)
    _assert_rule(message, "deployment-image")
    assert "ghcr.io/finetune-operator/server" in str(message)
    # The operator applies a server's Deployment again when its adapters change: an update is fenced too.
    real = fenced.apps.create_namespaced_deployment(fenced.namespace, fenced.deployment())
    try:
        patch = {
            "spec": {"template": {"spec": {"containers": [{"name": "server", "image": "docker.io/evil/miner:1"}]}}}
        }
        with pytest.raises(ApiException) as refused:
            fenced.apps.patch_namespaced_deployment(real.metadata.name, fenced.namespace, patch, dry_run="All")
        _assert_rule(str(refused.value.body), "deployment-image")
    finally:
        client.AppsV1Api(kube).delete_namespaced_deployment(real.metadata.name, fenced.namespace)


def test_a_writable_claim_is_refused(fenced: Fenced) -> None:
    made = fenced.deployment()
    claim = next(v for v in _pod(made)["volumes"] if "persistentVolumeClaim" in v)
    claim["persistentVolumeClaim"]["readOnly"] = False
    _assert_rule(fenced.refusal(fenced.apps.create_namespaced_deployment, made), "deployment-volume-kinds")
    made = fenced.deployment()
    mount = next(m for m in _container(made)["volumeMounts"] if m["mountPath"].startswith("/mnt/claims/"))
    mount["readOnly"] = False
    _assert_rule(fenced.refusal(fenced.apps.create_namespaced_deployment, made), "deployment-mounts")
    made = fenced.deployment()
    # A claim over the image's own folders, or where the server writes.
    mount = next(m for m in _container(made)["volumeMounts"] if m["mountPath"].startswith("/mnt/claims/"))
    mount.update(mountPath="/tmp", readOnly=True)
    _container(made)["volumeMounts"] = [m for m in _container(made)["volumeMounts"] if m["name"] != "tmp"]
    _assert_rule(fenced.refusal(fenced.apps.create_namespaced_deployment, made), "deployment-mounts")


def test_a_token_is_refused(fenced: Fenced) -> None:
    made = fenced.deployment()
    _pod(made)["automountServiceAccountToken"] = True
    _assert_rule(fenced.refusal(fenced.apps.create_namespaced_deployment, made), "deployment-token")
    made = fenced.deployment()
    _pod(made)["serviceAccountName"] = "finetune-trainer"
    _assert_rule(fenced.refusal(fenced.apps.create_namespaced_deployment, made), "deployment-token")
    made = fenced.deployment()
    token = {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
    _pod(made)["volumes"].append(token)
    _container(made)["volumeMounts"].append({"name": "token", "mountPath": "/mnt/claims/token", "readOnly": True})
    _assert_rule(fenced.refusal(fenced.apps.create_namespaced_deployment, made), "deployment-volume-kinds")


@pytest.mark.parametrize(
    "volume",
    [
        {"nfs": {"server": "10.0.0.5", "path": "/exports/team-b", "readOnly": True}},
        {"hostPath": {"path": "/var/lib/finetune/volumes/team-b"}},
        {"csi": {"driver": "nfs.csi.k8s.io", "readOnly": True, "volumeAttributes": {"share": "/team-b"}}},
        {"ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadOnlyMany"], "dataSourceRef": {
            "kind": "PersistentVolumeClaim", "name": "theirs"}, "resources": {"requests": {"storage": "1Gi"}}}}}},
    ],
    ids=["nfs", "hostPath", "csi", "ephemeral-clone"],
)  # fmt: skip
def test_storage_of_another_namespace_is_refused(fenced: Fenced, volume: dict[str, Any]) -> None:
    """A pod names claims of its own namespace alone; these reach storage by other roads."""
    made = fenced.deployment()
    _pod(made)["volumes"].append({"name": "theirs", **volume})
    _container(made)["volumeMounts"].append({"name": "theirs", "mountPath": "/mnt/claims/theirs", "readOnly": True})
    _assert_rule(fenced.refusal(fenced.apps.create_namespaced_deployment, made), "deployment-volume-kinds")


def test_another_command_or_a_flag_that_serves_files_is_refused(fenced: Fenced) -> None:
    made = fenced.deployment()
    _container(made)["command"] = ["sh", "-c", "cat /mnt/claims/models/*"]
    _assert_rule(fenced.refusal(fenced.apps.create_namespaced_deployment, made), "deployment-command")
    made = fenced.deployment()
    _container(made)["args"] += ["--path", "/mnt/claims/models"]  # llama-server would serve the claim's files
    _assert_rule(fenced.refusal(fenced.apps.create_namespaced_deployment, made), "deployment-command")
    made = fenced.deployment()
    _container(made)["readinessProbe"] = {"exec": {"command": ["cat", "/etc/shadow"]}}
    _assert_rule(fenced.refusal(fenced.apps.create_namespaced_deployment, made), "deployment-hooks")


def test_pod_security_and_ownership_are_the_trainers(fenced: Fenced) -> None:
    made = fenced.deployment()
    context = _container(made)["securityContext"]
    context.pop("allowPrivilegeEscalation")
    context["privileged"] = True
    _assert_rule(fenced.refusal(fenced.apps.create_namespaced_deployment, made), "deployment-privileged")
    made = fenced.deployment()
    _container(made)["env"].append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "x", "key": "token"}}})
    _assert_rule(fenced.refusal(fenced.apps.create_namespaced_deployment, made), "deployment-env")
    made = fenced.deployment()
    made["metadata"]["ownerReferences"][0]["kind"] = "FineTuneJob"
    _assert_rule(fenced.refusal(fenced.apps.create_namespaced_deployment, made), "deployment-owner")
    made = fenced.deployment()
    made["spec"]["selector"]["matchLabels"] = {"app": "anything"}
    made["spec"]["template"]["metadata"]["labels"]["app"] = "anything"
    _assert_rule(fenced.refusal(fenced.apps.create_namespaced_deployment, made), "deployment-pods")


def test_its_service_and_policy_open_nothing_more(fenced: Fenced) -> None:
    policy, service, _ = fenced.children()
    wide = copy.deepcopy(policy)
    wide["spec"]["egress"] = [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]
    _assert_rule(fenced.refusal(fenced.networking.create_namespaced_network_policy, wide), "server-networkpolicy-rules")
    wide = copy.deepcopy(policy)
    wide["spec"]["ingress"][0]["ports"] = [{"protocol": "TCP", "port": 22}]
    _assert_rule(fenced.refusal(fenced.networking.create_namespaced_network_policy, wide), "server-networkpolicy-rules")
    wide = copy.deepcopy(policy)
    wide["spec"]["podSelector"] = {"matchLabels": {"finetune.dev/server": "chat"}}
    _assert_rule(fenced.refusal(fenced.networking.create_namespaced_network_policy, wide), "server-networkpolicy-pods")
    exposed = copy.deepcopy(service)
    exposed["spec"]["type"] = "NodePort"
    _assert_rule(fenced.refusal(fenced.core.create_namespaced_service, exposed), "service-internal")


def test_nothing_is_made_where_the_operator_never_writes(fenced: Fenced) -> None:
    made = fenced.deployment()
    made["metadata"]["namespace"] = SYSTEM_NAMESPACE
    message = fenced.refusal(fenced.apps.create_namespaced_deployment, made, namespace=SYSTEM_NAMESPACE)
    _assert_rule(message, "operator-namespaces")

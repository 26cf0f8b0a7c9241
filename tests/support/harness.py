"""Running the real operator in tests: under its own ServiceAccount, bound to the chart's RBAC
rules (charts/finetune-operator/files/operator-rbac.yaml), never as cluster admin.

The operator is a subprocess (`python -m finetune_operator -n NS`) per test namespace, so each
test owns its operator, its logs, and can kill it.
"""

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from finetune_api.constants import API_VERSION, GROUP, KIND, PLURAL, VERSION
from finetune_api.contract import PREFLIGHT_POD_LABEL
from finetune_api.images import DEFAULT_ALLOWED_IMAGES, DEFAULT_ALLOWED_SERVING_IMAGES
from finetune_operator.setting_parsers import SYSTEM_NAMESPACES

REPO = Path(__file__).resolve().parents[2]
RBAC_FILE = REPO / "charts" / "finetune-operator" / "files" / "operator-rbac.yaml"
LEADER_RBAC_FILE = REPO / "charts" / "finetune-operator" / "files" / "operator-leader-rbac.yaml"
TRAINER_POLICY_FILE = REPO / "charts" / "finetune-operator" / "files" / "trainer-status-policy.yaml"
FENCE_POLICY_FILE = REPO / "charts" / "finetune-operator" / "files" / "operator-fence-policy.yaml"
SYSTEM_NAMESPACE = "finetune-system"
OPERATOR_SA = "finetune-operator"
OPERATOR_USER = f"system:serviceaccount:{SYSTEM_NAMESPACE}:{OPERATOR_SA}"
OPERATOR_ROLE = "finetune-operator-tests"
# The Lease the tests' operators elect their leader on (FINETUNE_LEASE_NAME), in SYSTEM_NAMESPACE.
TEST_LEASE = "finetune-operator-tests"
# The tests' `trainer.hubEnv`: the fence they install admits HF_ENDPOINT at this value only.
FENCE_HUB_ENV = {"HF_ENDPOINT": "https://hub.fence.example"}
# The tests' `trainer.networkPolicy`, as the chart's helper finetune-operator.trainerNetwork
# renders the defaults with apiServerCIDRs [127.0.0.1/32] (tests/chart/test_render.py holds the
# two equal): the operator the tests run copies these rules into each job's NetworkPolicy, and
# the fence they install admits those rules only.
TRAINER_NETWORK: dict[str, Any] = {
    "egress": [
        {
            "to": [{"ipBlock": {"cidr": "127.0.0.1/32"}}],
            "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}],
        },
        {
            "to": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                }
            ],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        },
    ],
    "hubEgress": {
        "to": [
            {
                "ipBlock": {
                    "cidr": "0.0.0.0/0",
                    "except": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16"],
                }
            }
        ],
        "ports": [{"protocol": "TCP", "port": 443}],
    },
    "peerPorts": [{"protocol": "TCP", "port": 29400}, {"protocol": "TCP", "port": 32768, "endPort": 60999}],
    "objectEgress": [],
}

T = TypeVar("T")


def operator_rules() -> list[dict[str, Any]]:
    rules = yaml.safe_load(RBAC_FILE.read_text())
    assert isinstance(rules, list)
    return rules


def leader_rules(lease: str = TEST_LEASE) -> list[dict[str, Any]]:
    """The Role's rules on the leader-election Lease, named as the chart names it."""
    rules = yaml.safe_load(LEADER_RBAC_FILE.read_text())
    assert isinstance(rules, list)
    for rule in rules:
        if "resourceNames" in rule:
            rule["resourceNames"] = [lease]
    return rules


def trainer_status_policy() -> list[dict[str, Any]]:
    """The chart's two ValidatingAdmissionPolicies (by name, by the pod's label), each followed by its
    binding, as the chart renders them (sans labels)."""
    objects = yaml.safe_load(TRAINER_POLICY_FILE.read_text())
    assert isinstance(objects, list) and len(objects) == 4
    return objects


# An operator without the input check (preflight.enabled false), for jobs whose pods are KWOK's and
# whose claims hold no model: the reliability runs measure the operator's own reconcile; the
# input check has its own tests (tests/operator/test_e2e_preflight.py).
NO_INPUT_CHECK = {"FINETUNE_PREFLIGHT": "false"}

TRAINER_RULES = "finetune-trainer-rules"


def trainer_rules_policy(trainer_network: Mapping[str, Any] = TRAINER_NETWORK) -> dict[str, Any]:
    """The fence's parameter for NetworkPolicies, as the chart renders it in its namespace: a
    NetworkPolicy that selects no pod, whose egress is every rule a trainer may get and whose one
    ingress rule holds the multi-node ports."""
    none = {"podSelector": {"matchLabels": {"finetune.dev/trainer-rules": "template"}}}
    hub = trainer_network.get("hubEgress")
    objects = list(trainer_network.get("objectEgress") or [])
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": TRAINER_RULES, "namespace": SYSTEM_NAMESPACE},
        "spec": {
            **none,
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [none], "ports": list(trainer_network["peerPorts"])}],
            "egress": [*trainer_network["egress"], *([hub] if hub else []), *objects],
        },
    }


def operator_fence_policies(
    user: str = OPERATOR_USER,
    allowed_images: Sequence[str] = DEFAULT_ALLOWED_IMAGES,
    hub_env: Mapping[str, str] = FENCE_HUB_ENV,
) -> list[dict[str, Any]]:
    """The chart's operator fence, as the chart renders it (sans names and labels): each policy
    of the file for this operator user, allow-list and Hub variables, with the system namespaces
    and the operator's own excluded, each followed by its Deny binding."""
    policies = yaml.safe_load(FENCE_POLICY_FILE.read_text())
    assert isinstance(policies, list) and policies
    values = {
        "allowedImages": list(allowed_images),
        "allowedServingImages": list(DEFAULT_ALLOWED_SERVING_IMAGES),
        "hubEnv": dict(hub_env),
        "excludedNamespaces": [*SYSTEM_NAMESPACES, SYSTEM_NAMESPACE],
        "operatorNamespace": SYSTEM_NAMESPACE,
    }
    objects: list[dict[str, Any]] = []
    for policy in policies:
        spec = policy["spec"]
        spec["matchConditions"] = [{"name": "operator-only", "expression": f"request.userInfo.username == '{user}'"}]
        for variable in spec.get("variables") or []:
            if variable["name"] in values:
                # Sorted keys, as Helm's toJson writes them.
                variable["expression"] = json.dumps(values[variable["name"]], separators=(",", ":"), sort_keys=True)
        name = policy["metadata"]["name"]
        binding = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        }
        if spec.get("paramKind", {}).get("kind") == "FineTuneJob":
            # Every FineTuneJob of the request's namespace (finetune-fence-job-secrets).
            binding["spec"]["paramRef"] = {"selector": {}, "parameterNotFoundAction": "Allow"}
        elif "paramKind" in spec:
            # The chart's trainer rules (trainer_rules_policy), in the operator's namespace.
            binding["spec"]["paramRef"] = {
                "name": TRAINER_RULES,
                "namespace": SYSTEM_NAMESPACE,
                "parameterNotFoundAction": "Allow",
            }
        objects += [policy, binding]
    return objects


def wait_for(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.5) -> T:
    """Poll until `check` returns something truthy; fail naming what never happened."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def _create(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except ApiException as exc:
        if exc.status != 409:
            raise


def kubeconfig_for_token(admin_kubeconfig: Path, token: str, path: Path, namespace: str = "default") -> Path:
    """A kubeconfig with the admin's server and CA but the given bearer token."""
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    cluster = dict(admin["clusters"][0]["cluster"])
    ca_file = cluster.pop("certificate-authority", None)
    if ca_file:
        ca_path = Path(ca_file) if Path(ca_file).is_absolute() else admin_kubeconfig.parent / ca_file
        cluster["certificate-authority-data"] = base64.b64encode(ca_path.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "sa", "namespace": namespace}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def service_account_token(
    core: client.CoreV1Api, namespace: str, name: str, seconds: int = 7200, pod: tuple[str, str] | None = None
) -> str:
    """A token of the ServiceAccount; bound to the pod (name, uid) if given, as a kubelet binds one."""
    spec: dict[str, Any] = {"expirationSeconds": seconds}
    if pod is not None:
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": pod[0], "uid": pod[1]}
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    result = core.create_namespaced_service_account_token(name, namespace, request)
    return str(result.status.token)


def operator_identity(api: client.ApiClient, admin_kubeconfig: Path, folder: Path) -> Path:
    """ServiceAccount + ClusterRole (the chart's rules) + binding; a kubeconfig with its token."""
    core = client.CoreV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    _create(core.create_namespace, {"metadata": {"name": SYSTEM_NAMESPACE}})
    _create(core.create_namespaced_service_account, SYSTEM_NAMESPACE, {"metadata": {"name": OPERATOR_SA}})
    role = {"metadata": {"name": OPERATOR_ROLE}, "rules": operator_rules()}
    try:
        rbac.create_cluster_role(role)
    except ApiException as exc:
        if exc.status != 409:
            raise
        rbac.replace_cluster_role(OPERATOR_ROLE, role)
    _create(
        rbac.create_cluster_role_binding,
        {
            "metadata": {"name": OPERATOR_ROLE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": OPERATOR_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": SYSTEM_NAMESPACE}],
        },
    )
    leader_role(api, SYSTEM_NAMESPACE, OPERATOR_SA)
    token = service_account_token(core, SYSTEM_NAMESPACE, OPERATOR_SA)
    return kubeconfig_for_token(admin_kubeconfig, token, folder / "operator.kubeconfig", SYSTEM_NAMESPACE)


def leader_role(api: client.ApiClient, namespace: str, account: str, lease: str = TEST_LEASE) -> None:
    """The chart's leader-election Role and RoleBinding for `account`, in its own namespace."""
    rbac = client.RbacAuthorizationV1Api(api)
    name = f"{account}-leader-election"
    role = {"metadata": {"name": name}, "rules": leader_rules(lease)}
    try:
        rbac.create_namespaced_role(namespace, role)
    except ApiException as exc:
        if exc.status != 409:
            raise
        rbac.replace_namespaced_role(name, namespace, role)
    _create(
        rbac.create_namespaced_role_binding,
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    )


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports. All sockets stay bound until every port is chosen: two
    calls of bind-to-0-and-close may get the same port back, and an operator whose health
    and metrics servers share a port dies at start (the metrics server even answers /healthz)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def free_port() -> int:
    return free_ports(1)[0]


def healthz_ok(port: int) -> bool:
    """The process answers 200 on /healthz (kopf's liveness endpoint) on this loopback port."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def stop_process_group(proc: "subprocess.Popen[bytes] | None") -> None:
    """SIGTERM the process group of an operator subprocess, SIGKILL it if it lingers."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


class OperatorProcess:
    """`python -m finetune_operator` watching one namespace, logs in a file."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path, env: dict[str, str] | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.log = log
        self.health_port, self.metrics_port = free_ports(2)
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True) -> "OperatorProcess":
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "FINETUNE_RESYNC_SECONDS": "5",
            "FINETUNE_LOG_LEVEL": "DEBUG",
            "FINETUNE_TRAINER_NETWORK": json.dumps(TRAINER_NETWORK),
            **self.extra_env,
        }
        for key in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
            env.pop(key, None)
        cmd = [
            sys.executable,
            "-m",
            "finetune_operator",
            "-n",
            self.namespace,
            "--health-port",
            str(self.health_port),
            "--metrics-port",
            str(self.metrics_port),
            "--log-format",
            "json",
        ]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        if wait:
            wait_for(self.healthy, 60, f"operator healthz on port {self.health_port}; log:\n{self.tail()}")
        return self

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc and self.proc.returncode}; log:\n{self.tail()}")
        return healthz_ok(self.health_port)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    def requests(self) -> dict[str, float]:
        """What the operator asked the API server so far, by its own count
        (finetune_api_requests_total), as {"verb kind": count}; its watches are not in it."""
        counts: dict[str, float] = {}
        for line in self.metrics().splitlines():
            if line.startswith("finetune_api_requests_total{"):
                labels = dict(part.split("=", 1) for part in line[line.index("{") + 1 : line.index("}")].split(","))
                key = f"{labels['verb'].strip(chr(34))} {labels['kind'].strip(chr(34))}"
                counts[key] = counts.get(key, 0) + float(line.rsplit(" ", 1)[1])
        return counts

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> None:
        stop_process_group(self.proc)

    def tail(self, size: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-size:] if self.log.exists() else ""

    def log_records(self) -> Iterator[dict[str, Any]]:
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                record = json.loads(line)
                if isinstance(record, dict):
                    yield record


# --- FineTuneJobs ----------------------------------------------------------------------------


def finetunejob(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}


class Jobs:
    """FineTuneJobs of one namespace, as an admin sees them."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.api = api

    def create(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, finetunejob(name, spec)
        )
        return body

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name
            )
            return found
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def status(self, name: str) -> dict[str, Any]:
        return (self.get(name) or {}).get("status") or {}

    def patch_spec(self, name: str, patch: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name, {"spec": patch})

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def wait_phase(self, name: str, phases: str | tuple[str, ...], timeout: float) -> dict[str, Any]:
        wanted = (phases,) if isinstance(phases, str) else phases

        def check() -> dict[str, Any] | None:
            status = self.status(name)
            return status if status.get("phase") in wanted else None

        return wait_for(check, timeout, f"{name} phase in {wanted} (status: {self.status(name)})")

    def status_when(
        self, name: str, ready: Callable[[dict[str, Any]], bool], what: str, timeout: float = 75
    ) -> dict[str, Any]:
        """The status once `ready` holds. For what another process writes in the background (the
        trainer's status patches): the default outlasts the trainer's retries of its last one."""

        def check() -> dict[str, Any] | None:
            status = self.status(name)
            return status if ready(status) else None

        try:
            return wait_for(check, timeout, f"{name}: {what}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its status: {self.status(name)}") from None

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        return next((c for c in self.status(name).get("conditions") or [] if c["type"] == kind), {})

    def pods(self, name: str, preflight: bool = False) -> list[dict[str, Any]]:
        """The job's trainer pods (preflight: its input check's)."""
        selector = (
            f"{GROUP}/job={name},{PREFLIGHT_POD_LABEL}" if preflight else f"{GROUP}/job={name},!{PREFLIGHT_POD_LABEL}"
        )
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector)
        return [self.api.sanitize_for_serialization(p) for p in pods.items]

    def events(self, name: str) -> list[dict[str, Any]]:
        found = self.core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={name}")
        return [self.api.sanitize_for_serialization(e) for e in found.items]

    def operator_events(self, name: str, settle_s: float = 2.0) -> list[dict[str, Any]]:
        """The Events on the FineTuneJob itself (its Job, of the same name, has the Job
        controller's), after `settle_s`: the operator posts a write's Events after its status."""
        time.sleep(settle_s)
        return [e for e in self.events(name) if e["involvedObject"]["kind"] == "FineTuneJob"]

    def events_with(self, name: str, *reasons: str, timeout: float = 30) -> list[dict[str, Any]]:
        """The job's Events once every one of `reasons` is among them. kopf posts Events from a
        background queue after the status patch, so a phase seen does not mean its Event is listed yet."""

        def check() -> list[dict[str, Any]] | None:
            found = self.events(name)
            return found if set(reasons) <= {e["reason"] for e in found} else None

        return wait_for(check, timeout, f"Events {sorted(reasons)} on {name}")


def reported_the_end(status: Mapping[str, Any], sample: bool = False) -> bool:
    """Whether the trainer's last status is in: its progress at the last step (and its sample
    answer when the job asked for one)."""
    progress = status.get("progress") or {}
    at_end = bool(progress.get("totalSteps")) and progress.get("step") == progress.get("totalSteps")
    return at_end and (not sample or "sample" in status)


def volume_folder(repo: Path, namespace: str, claim: str) -> Path:
    return repo / ".cache" / "cluster" / "volumes" / namespace / claim


def trainer_identity_of(api: client.ApiClient, namespace: str) -> dict[str, list[str]]:
    """The namespace's shared trainer identity: objects of component trainer that are no job's own."""
    selector = "finetune.dev/component=trainer,!finetune.dev/job"
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    return {
        "ServiceAccount": [
            o.metadata.name for o in core.list_namespaced_service_account(namespace, label_selector=selector).items
        ],
        "Role": [o.metadata.name for o in rbac.list_namespaced_role(namespace, label_selector=selector).items],
        "RoleBinding": [
            o.metadata.name for o in rbac.list_namespaced_role_binding(namespace, label_selector=selector).items
        ],
    }

"""The operator fence (charts/finetune-operator/files/operator-fence-policy.yaml), proven on the
real API server with the operator's own ServiceAccount token, never admin:

- each request the issue lists (a Job as another ServiceAccount, privileged, with a hostPath,
  with an image outside the allow-list, with no FineTuneJob owner; a RoleBinding to
  cluster-admin or to another subject; a Role with an extra verb) is refused at admission with
  a message naming the fence's rule;
- what the operator really sends (the builders' Job, identity and claims) is admitted;
- the allow-list rule reads every image the same way in CEL as images.py does in Python;
- a FineTuneJob whose image is outside the list ends Failed with ImageNotAllowed, and no Job.

RBAC already refuses some of these on its own (granting a Role or binding the operator does
not hold is an escalation). So that every refusal here is the fence's, the operator's RBAC is
widened in this test's namespace (escalate, bind, and writes it never has): the fence must
hold where RBAC has been loosened. Requests are dry runs: admission runs in full and nothing
is stored. The session's operator tests run the real operator inside this same fence.
"""

import copy
import dataclasses
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from finetune_api import contract
from finetune_api.constants import API_VERSION, KIND, TRAINER_SERVICE_ACCOUNT
from finetune_api.services import ServiceUrl
from finetune_api.spec import FineTuneJobSpec
from finetune_operator.builders import job as job_builder
from finetune_operator.builders import multinode as multinode_builder
from finetune_operator.builders import network as network_builder
from finetune_operator.builders import objects as objects_builder
from finetune_operator.builders import preflight as preflight_builder
from finetune_operator.builders import pvc as pvc_builder
from finetune_operator.builders import rbac as rbac_builder
from finetune_operator.children import Owner
from finetune_operator.settings import SETTINGS, Settings, from_env
from tests.fixtures.cluster import Cluster, token_client
from tests.support.harness import (
    FENCE_HUB_ENV,
    OPERATOR_SA,
    SYSTEM_NAMESPACE,
    TEST_LEASE,
    TRAINER_NETWORK,
    Jobs,
    OperatorProcess,
    operator_fence_policies,
    operator_identity,
    wait_for,
)
from tests.support.images import CASES, PATTERNS
from tests.support.install import admission_policies_install
from tests.support.specs import body as spec_body
from tests.support.specs import gpu_spec

pytestmark = pytest.mark.cluster

# What a loosened RBAC might add: none of it is in files/operator-rbac.yaml.
WIDENED_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "clusterroles"], "verbs": ["bind", "escalate"]},
    {"apiGroups": [""], "resources": ["services", "configmaps", "pods"], "verbs": ["create"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["delete"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
]


class Fenced:
    """The operator's token in one namespace, and a FineTuneJob there to own children."""

    def __init__(self, api: client.ApiClient, namespace: str, owner: Owner) -> None:
        self.namespace = namespace
        self.owner = owner
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.rbac = client.RbacAuthorizationV1Api(api)
        self.networking = client.NetworkingV1Api(api)

    def refusal(self, create: Callable[..., Any], body: dict[str, Any]) -> str | None:
        """None when admitted (dry run); else the API server's message."""
        try:
            create(self.namespace, body, dry_run="All")
        except ApiException as exc:
            assert exc.status in (403, 422), f"unexpected HTTP {exc.status}: {exc.body}"
            return str(exc.body)
        return None

    def job(self, image: str | None = None) -> dict[str, Any]:
        spec = FineTuneJobSpec.model_validate(spec_body(image=image) if image else spec_body())
        return job_builder.job(self.owner, spec, Settings())


@pytest.fixture(scope="module")
def fenced(cluster: Cluster, kube: client.ApiClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fenced]:
    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    namespace = f"fence-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace, "labels": {"finetune.dev/test": "true"}}})
    operator_identity(kube, cluster.kubeconfig, tmp_path_factory.mktemp("fence"))
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "widened"}, "rules": WIDENED_RULES})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "widened"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "widened"},
            "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": SYSTEM_NAMESPACE}],
        },
    )
    ftj = client.CustomObjectsApi(kube).create_namespaced_custom_object(
        "finetune.dev",
        "v1alpha1",
        namespace,
        "finetunejobs",
        {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "owner"}, "spec": spec_body()},
    )
    owner = Owner(name="owner", namespace=namespace, uid=ftj["metadata"]["uid"])
    token = token_client(cluster, core, SYSTEM_NAMESPACE, OPERATOR_SA)
    fenced = Fenced(token, namespace, owner)

    # The fence was (re)applied as this module started (its conftest installs the chart's objects):
    # a policy takes a moment to reach the admission plugin, so wait until it refuses an image off
    # the allow-list before any case, as the image cases below do for their own policy.
    # Only the fence's own words count: an RBAC refusal comes back too while the authorizer has not
    # yet seen the widened binding (under load it once refused the cluster-admin binding below for
    # escalation, before admission ran). That binding refused by the fence proves both are live.
    def by_fence(create: Callable[..., Any], body: dict[str, Any]) -> str | None:
        message = fenced.refusal(create, body)
        return message if message and "finetune-operator fence, rule" in message else None

    wait_for(lambda: by_fence(fenced.batch.create_namespaced_job, fenced.job("docker.io/x/y:1")), 60, "the fence")
    admin = rbac_builder.role_binding(namespace)
    admin["roleRef"] = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"}
    wait_for(lambda: by_fence(fenced.rbac.create_namespaced_role_binding, admin), 60, "the widened role's bind")
    yield fenced
    core.delete_namespace(namespace, propagation_policy="Background")


def _assert_rule(message: str | None, rule: str) -> None:
    assert message is not None, f"admitted, but rule {rule} should have refused it"
    assert f"finetune-operator fence, rule {rule}:" in message, message


# --- Jobs -----------------------------------------------------------------------------------


def test_the_builders_job_is_admitted(fenced: Fenced) -> None:
    assert fenced.refusal(fenced.batch.create_namespaced_job, fenced.job()) is None
    pinned = fenced.job("ghcr.io/finetune-operator/trainer@sha256:" + "a" * 64)
    assert fenced.refusal(fenced.batch.create_namespaced_job, pinned) is None


def _pod(job: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    return pod


def test_a_job_as_another_service_account_is_refused(fenced: Fenced) -> None:
    job = fenced.job()
    _pod(job)["serviceAccountName"] = "default"
    _assert_rule(fenced.refusal(fenced.batch.create_namespaced_job, job), "job-service-account")


def test_a_privileged_job_is_refused(fenced: Fenced) -> None:
    job = fenced.job()
    context = _pod(job)["containers"][0]["securityContext"]
    context.pop("allowPrivilegeEscalation")  # the API server itself refuses privileged with it false
    context["privileged"] = True
    _assert_rule(fenced.refusal(fenced.batch.create_namespaced_job, job), "job-privileged")


def test_a_job_with_a_host_path_is_refused(fenced: Fenced) -> None:
    job = fenced.job()
    _pod(job)["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    # Not mounted: mounted anywhere but the trainer's folders, job-mounts would refuse it first.
    _assert_rule(fenced.refusal(fenced.batch.create_namespaced_job, job), "job-host-path")


def test_a_job_on_the_host_network_or_mounting_a_secret_is_refused(fenced: Fenced) -> None:
    job = fenced.job()
    _pod(job)["hostNetwork"] = True
    _assert_rule(fenced.refusal(fenced.batch.create_namespaced_job, job), "job-host-namespaces")
    job = fenced.job()
    _pod(job)["volumes"].append({"name": "creds", "secret": {"secretName": "anything"}})
    _assert_rule(fenced.refusal(fenced.batch.create_namespaced_job, job), "job-volume-kinds")


def test_a_job_with_an_image_outside_the_allow_list_is_refused(fenced: Fenced) -> None:
    message = fenced.refusal(fenced.batch.create_namespaced_job, fenced.job("docker.io/evil/miner:latest"))
    _assert_rule(message, "job-image")
    assert "docker.io/evil/miner:latest" in str(message) and "ghcr.io/finetune-operator/trainer" in str(message)


def test_a_job_with_no_finetunejob_owner_is_refused(fenced: Fenced) -> None:
    job = fenced.job()
    del job["metadata"]["ownerReferences"]
    _assert_rule(fenced.refusal(fenced.batch.create_namespaced_job, job), "job-owner")
    job = fenced.job()
    job["metadata"]["ownerReferences"][0].update(apiVersion="apps/v1", kind="Deployment")
    _assert_rule(fenced.refusal(fenced.batch.create_namespaced_job, job), "job-owner")


def test_a_root_or_unconfined_job_is_refused(fenced: Fenced) -> None:
    job = fenced.job()
    _pod(job)["securityContext"]["runAsUser"] = 0
    _pod(job)["securityContext"]["runAsNonRoot"] = False
    _pod(job)["containers"][0]["securityContext"].pop("runAsNonRoot")
    _assert_rule(fenced.refusal(fenced.batch.create_namespaced_job, job), "job-non-root")
    job = fenced.job()
    _pod(job)["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
    _pod(job)["containers"][0]["securityContext"].pop("seccompProfile")
    _assert_rule(fenced.refusal(fenced.batch.create_namespaced_job, job), "job-seccomp")
    job = fenced.job()
    _pod(job)["containers"][0]["securityContext"]["capabilities"] = {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    _assert_rule(fenced.refusal(fenced.batch.create_namespaced_job, job), "job-capabilities")


# --- the Job the operator makes is the only Job it can make ----------------------------------

HUB_TOKENS = {
    "model": {"source": {"hub": {"id": "org/private", "tokenSecret": "hub-token"}}},
    "dataset": {
        "source": {"hub": {"id": "org/data", "tokenSecret": "data-token"}},
        # A separate held-out source with a third Secret: its token is HF_EVAL_TOKEN.
        "eval": {"hub": {"id": "org/held-out", "tokenSecret": "eval-token"}},
        "format": "alpaca",
    },
}
# The operator's real Jobs, as the chart's settings make them (its Hub endpoint included).
REAL_JOBS: dict[str, dict[str, Any]] = {
    "one-node": spec_body(),
    "multi-node": {**gpu_spec(), "resources": {"gpus": 4, "nodes": 2, "cpu": "2", "memory": "8Gi"}},
    "hub": spec_body(**HUB_TOKENS),
    "kueue": spec_body(placement={"queueName": "team-a"}),
    # The held-out source on a claim of its own, mounted at the contract's EVAL_MOUNT.
    "held-out": spec_body(dataset={"eval": {"pvc": {"claimName": "evals", "path": "e.jsonl"}}}),
}
FENCE_SETTINGS = Settings(hub_env=FENCE_HUB_ENV)


def _real_job(owner: Owner, kind: str) -> dict[str, Any]:
    return multinode_builder.indexed_job(owner, FineTuneJobSpec.model_validate(REAL_JOBS[kind]), FENCE_SETTINGS)


@pytest.mark.parametrize("kind", REAL_JOBS)
def test_the_operators_real_jobs_are_admitted(fenced: Fenced, kind: str) -> None:
    assert fenced.refusal(fenced.batch.create_namespaced_job, _real_job(fenced.owner, kind)) is None


def _container(job: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = _pod(job)["containers"][0]
    return container


def _context(job: dict[str, Any], pod: bool = False) -> dict[str, Any]:
    context: dict[str, Any] = _pod(job)["securityContext"] if pod else _container(job)["securityContext"]
    return context


def _set_env(job: dict[str, Any], entry: dict[str, Any]) -> None:
    env = [e for e in _container(job)["env"] if e["name"] != entry["name"]]
    _container(job)["env"] = [*env, entry]


def _secret(name: str, key: str) -> dict[str, Any]:
    return {"secretKeyRef": {"name": name, "key": key}}


def _second(job: dict[str, Any], name: str) -> dict[str, Any]:
    return {**copy.deepcopy(_container(job)), "name": name}


# (what the variant changes, the change, the rule that must refuse it). The issue's seven first.
VARIANTS: list[tuple[str, Callable[[dict[str, Any]], object], str]] = [
    (
        "another-command",
        lambda j: _container(j).update(
            command=["sh", "-c", "cat /var/run/secrets/kubernetes.io/serviceaccount/token > /dev/termination-log"]
        ),
        "job-command",
    ),
    (
        "hub-endpoint-elsewhere",
        lambda j: _set_env(j, {"name": "HF_ENDPOINT", "value": "https://collector.example"}),
        "job-hub-env",
    ),
    ("env-from-secret", lambda j: _container(j).update(envFrom=[{"secretRef": {"name": "db"}}]), "job-env-from"),
    (
        "hub-token-from-another-key",
        lambda j: _set_env(j, {"name": "HF_TOKEN", "valueFrom": _secret("db", "password")}),
        "job-env-secrets",
    ),
    ("apparmor-unconfined", lambda j: _context(j).update(appArmorProfile={"type": "Unconfined"}), "job-apparmor"),
    (
        "unsafe-sysctl",
        lambda j: _context(j, pod=True).update(sysctls=[{"name": "kernel.msgmax", "value": "65536"}]),
        "job-sysctls",
    ),
    (
        "proc-mount-unmasked",
        lambda j: (_context(j).update(procMount="Unmasked"), _pod(j).update(hostUsers=False)),
        "job-proc-mount",
    ),
    # What else runs, and what it is given.
    ("init-container", lambda j: _pod(j).update(initContainers=[_second(j, "init")]), "job-containers"),
    ("extra-container", lambda j: _pod(j)["containers"].append(_second(j, "sidecar")), "job-containers"),
    ("args", lambda j: _container(j).update(args=["--config", "/mnt/output/evil.json"]), "job-command"),
    ("working-dir", lambda j: _container(j).update(workingDir="/mnt/output"), "job-command"),
    (
        "post-start-hook",
        lambda j: _container(j).update(lifecycle={"postStart": {"exec": {"command": ["sh"]}}}),
        "job-hooks",
    ),
    ("exec-probe", lambda j: _container(j).update(livenessProbe={"exec": {"command": ["sh"]}}), "job-hooks"),
    (
        "mount-over-code",
        lambda j: _container(j)["volumeMounts"].append({"name": "output", "mountPath": "/usr/lib/python3"}),
        "job-mounts",
    ),
    ("another-env-name", lambda j: _set_env(j, {"name": "LD_PRELOAD", "value": "/mnt/output/x.so"}), "job-env-names"),
    (
        "other-variable-from-secret",
        lambda j: _set_env(j, {"name": "HOME", "valueFrom": _secret("db", "token")}),
        "job-env-secrets",
    ),
    (
        "variable-from-config-map",
        lambda j: _set_env(j, {"name": "HOME", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}),
        "job-env-secrets",
    ),
    # Pod Security restricted, each control, for the pod and for the container.
    ("apparmor-pod", lambda j: _context(j, pod=True).update(appArmorProfile={"type": "Unconfined"}), "job-apparmor"),
    (
        "apparmor-annotation",
        lambda j: j["spec"]["template"]["metadata"]["annotations"].update(
            {"container.apparmor.security.beta.kubernetes.io/trainer": "unconfined"}
        ),
        "job-apparmor",
    ),
    ("selinux-type-pod", lambda j: _context(j, pod=True).update(seLinuxOptions={"type": "spc_t"}), "job-selinux"),
    ("selinux-user-container", lambda j: _context(j).update(seLinuxOptions={"user": "system_u"}), "job-selinux"),
    ("selinux-role-container", lambda j: _context(j).update(seLinuxOptions={"role": "sysadm_r"}), "job-selinux"),
    ("host-users", lambda j: _pod(j).update(hostUsers=False), "job-host-users"),
    # The API server itself asks hostNetwork of a hostProcess pod; job-host-process is named first.
    (
        "host-process-pod",
        lambda j: (
            _context(j, pod=True).update(windowsOptions={"hostProcess": True}),
            _pod(j).update(hostNetwork=True),
        ),
        "job-host-process",
    ),
    (
        "host-process-container",
        lambda j: (_context(j).update(windowsOptions={"hostProcess": True}), _pod(j).update(hostNetwork=True)),
        "job-host-process",
    ),
    (
        "projected-volume",
        lambda j: _pod(j)["volumes"].append({"name": "x", "projected": {"sources": []}}),
        "job-volume-kinds",
    ),
    (
        "config-map-volume",
        lambda j: _pod(j)["volumes"].append({"name": "x", "configMap": {"name": "c"}}),
        "job-volume-kinds",
    ),
    ("host-path", lambda j: _pod(j)["volumes"].append({"name": "x", "hostPath": {"path": "/"}}), "job-host-path"),
    (
        "capabilities-add",
        lambda j: _context(j).update(capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
        "job-capabilities",
    ),
    ("capabilities-kept", lambda j: _context(j).update(capabilities={}), "job-capabilities"),
    ("privilege-escalation", lambda j: _context(j).update(allowPrivilegeEscalation=True), "job-privilege-escalation"),
    (
        "seccomp-pod-unconfined",
        lambda j: _context(j, pod=True).update(seccompProfile={"type": "Unconfined"}),
        "job-seccomp",
    ),
    (
        "seccomp-container-unconfined",
        lambda j: _context(j).update(seccompProfile={"type": "Unconfined"}),
        "job-seccomp",
    ),
    ("root-user-container", lambda j: _context(j).update(runAsUser=0), "job-non-root"),
    ("run-as-root-allowed-pod", lambda j: _context(j, pod=True).update(runAsNonRoot=False), "job-non-root"),
    ("host-pid", lambda j: _pod(j).update(hostPID=True), "job-host-namespaces"),
    ("host-ipc", lambda j: _pod(j).update(hostIPC=True), "job-host-namespaces"),
    (
        "host-port",
        lambda j: _container(j).update(ports=[{"containerPort": 8080, "hostPort": 8080}]),
        "job-host-namespaces",
    ),
]


@pytest.mark.parametrize(("change", "rule"), [(v[1], v[2]) for v in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_a_job_changed_in_one_way_is_refused_naming_its_rule(
    fenced: Fenced, change: Callable[[dict[str, Any]], object], rule: str
) -> None:
    """The hub job (a Hub token from its Secret, the chart's HF_ENDPOINT), otherwise right in every
    way, changed in one: refused at admission by the fence, whose message names the rule."""
    job = _real_job(fenced.owner, "hub")
    change(job)
    message = fenced.refusal(fenced.batch.create_namespaced_job, job)
    assert message is not None, "admitted"
    assert "finetune-operator fence, rule " + rule in message, message


def _preflight(owner: Owner, kind: str = "one-node") -> dict[str, Any]:
    spec = FineTuneJobSpec.model_validate(REAL_JOBS[kind])
    return preflight_builder.preflight_job(owner, spec, FENCE_SETTINGS)


@pytest.mark.parametrize("kind", ["one-node", "multi-node", "held-out"])
def test_the_operators_preflight_job_is_admitted(fenced: Fenced, kind: str) -> None:
    assert fenced.refusal(fenced.batch.create_namespaced_job, _preflight(fenced.owner, kind)) is None


def _limit(job: dict[str, Any], resource: str, value: str) -> None:
    for side in ("limits", "requests"):
        _container(job)["resources"][side][resource] = value


# The input check's command in any other shape than the pre-flight's: the GPU Job's resources, a
# token, the output claim, a writable claim, Hub egress, another name. Each refused by job-preflight.
PREFLIGHT_VARIANTS: list[tuple[str, Callable[[dict[str, Any]], object]]] = [
    ("a-gpu", lambda j: _limit(j, "nvidia.com/gpu", "1")),
    ("another-extended-resource", lambda j: _limit(j, "example.com/fpga", "1")),
    ("service-account-token", lambda j: _pod(j).update(automountServiceAccountToken=True)),
    ("token-left-default", lambda j: _pod(j).pop("automountServiceAccountToken")),
    ("hub-token", lambda j: _set_env(j, {"name": "HF_TOKEN", "valueFrom": _secret("hub-token", "token")})),
    (
        "output-claim",
        lambda j: (
            _pod(j)["volumes"].append({"name": "output", "persistentVolumeClaim": {"claimName": "o"}}),
            _container(j)["volumeMounts"].append({"name": "output", "mountPath": "/mnt/output"}),
        ),
    ),
    ("writable-claim", lambda j: _pod(j)["volumes"][-1]["persistentVolumeClaim"].update(readOnly=False)),
    ("hub-egress", lambda j: j["spec"]["template"]["metadata"]["labels"].update({"finetune.dev/hub-egress": "true"})),
    ("another-name", lambda j: j["metadata"].update(name="owner")),
]


@pytest.mark.parametrize("change", [v[1] for v in PREFLIGHT_VARIANTS], ids=[v[0] for v in PREFLIGHT_VARIANTS])
def test_the_input_check_in_another_shape_is_refused(
    fenced: Fenced, change: Callable[[dict[str, Any]], object]
) -> None:
    job = _preflight(fenced.owner)
    change(job)
    _assert_rule(fenced.refusal(fenced.batch.create_namespaced_job, job), "job-preflight")


def test_the_gpu_job_cannot_run_the_input_check(fenced: Fenced) -> None:
    """The trainer Job's shape (a GPU, the token, the output claim) with the input check's command."""
    job = _real_job(fenced.owner, "multi-node")
    _container(job)["command"] = list(contract.PREFLIGHT_COMMAND)
    _assert_rule(fenced.refusal(fenced.batch.create_namespaced_job, job), "job-preflight")


def test_a_job_made_under_an_earlier_hub_endpoint_can_still_be_suspended(
    kube: client.ApiClient, fenced: Fenced
) -> None:
    """trainer.hubEnv changed after a Job was made: the pod template cannot change, and the
    operator must still suspend and resume it (job-hub-env, like job-image, judges creation)."""
    job = _real_job(fenced.owner, "hub")
    job["metadata"]["name"] = "earlier"
    _set_env(job, {"name": "HF_ENDPOINT", "value": "https://hub.before.example"})
    job["spec"]["suspend"] = True
    client.BatchV1Api(kube).create_namespaced_job(fenced.namespace, job)
    fenced.batch.patch_namespaced_job("earlier", fenced.namespace, {"spec": {"suspend": False}}, dry_run="All")


# --- S3 credentials: the Secrets the job names, and no other ---------------------------------

S3_STORE = {"endpoint": "http://minio.storage:9000"}
S3_SPEC = spec_body(
    model={"source": {"pvc": None, "s3": {"bucket": "models", "key": "tiny/", "secretName": "s3-models", **S3_STORE}}},
    dataset={
        "source": {"pvc": None, "s3": {"bucket": "data", "key": "a.jsonl", "secretName": "s3-data", **S3_STORE}},
        "eval": {"s3": {"bucket": "data", "key": "e.jsonl", "secretName": "s3-eval", **S3_STORE}},
        "format": "alpaca",
    },
    output={
        "pvc": {"claimName": "outputs"},
        "s3": {"bucket": "out", "key": "tiny/", "secretName": "s3-out", **S3_STORE},
    },
)


@pytest.fixture(scope="module")
def s3_owner(kube: client.ApiClient, fenced: Fenced) -> Owner:
    """A FineTuneJob of the fenced namespace that names a Secret for each of its s3 fields."""
    made = client.CustomObjectsApi(kube).create_namespaced_custom_object(
        "finetune.dev",
        "v1alpha1",
        fenced.namespace,
        "finetunejobs",
        {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "s3-owner"}, "spec": S3_SPEC},
    )
    owner = Owner(name="s3-owner", namespace=fenced.namespace, uid=made["metadata"]["uid"])

    # The policy reads FineTuneJobs as its parameters: wait until it knows this one. Admitting
    # the builders' Job alone does not show it: a namespace whose FineTuneJobs the policy has not
    # seen yet is skipped, so another Secret would pass too. It knows the job once it admits the
    # Secrets the job names and refuses another.
    def knows() -> bool:
        other = _s3_jobs(owner)["fetch"]
        _other_secret(other)
        refused = fenced.refusal(fenced.batch.create_namespaced_job, other)
        return (
            refused is not None
            and "rule job-store-secrets:" in refused
            and fenced.refusal(fenced.batch.create_namespaced_job, _s3_jobs(owner)["fetch"]) is None
        )

    wait_for(knows, 60, "the fence to read the new FineTuneJob")
    return owner


def _s3_jobs(owner: Owner) -> dict[str, dict[str, Any]]:
    spec = FineTuneJobSpec.model_validate(S3_SPEC)
    return {
        "preflight": preflight_builder.preflight_job(owner, spec, FENCE_SETTINGS),
        "fetch": objects_builder.fetch_job(owner, spec, FENCE_SETTINGS, "10Gi"),
        "trainer": job_builder.job(owner, spec, FENCE_SETTINGS),
    }


def _secret_names(job: dict[str, Any]) -> set[str]:
    env = _container(job)["env"]
    return {e["valueFrom"]["secretKeyRef"]["name"] for e in env if "secretKeyRef" in e.get("valueFrom", {})}


@pytest.mark.parametrize("kind", ["preflight", "fetch", "trainer"])
def test_a_job_naming_secrets_under_s3_gets_exactly_those(fenced: Fenced, s3_owner: Owner, kind: str) -> None:
    job = _s3_jobs(s3_owner)[kind]
    assert fenced.refusal(fenced.batch.create_namespaced_job, job) is None
    # The pods that fetch hold the inputs' Secrets; the trainer the output's alone.
    assert _secret_names(job) == ({"s3-out"} if kind == "trainer" else {"s3-models", "s3-data", "s3-eval"})


def test_the_namespaces_object_cache_claim_is_admitted(fenced: Fenced) -> None:
    claim = objects_builder.cache_claim(fenced.namespace, "10Gi", FENCE_SETTINGS)
    assert fenced.refusal(fenced.core.create_namespaced_persistent_volume_claim, claim) is None
    renamed = copy.deepcopy(claim)
    renamed["metadata"]["name"] = "other-cache"
    _assert_rule(fenced.refusal(fenced.core.create_namespaced_persistent_volume_claim, renamed), "claim-owner")


def _other_secret(job: dict[str, Any]) -> None:
    for entry in _container(job)["env"]:
        if entry["name"] == "AWS_SECRET_ACCESS_KEY":
            entry["valueFrom"]["secretKeyRef"]["name"] = "db"


# A job's S3 Jobs changed in one way: each refused by the rule named.
S3_VARIANTS: list[tuple[str, str, Callable[[dict[str, Any]], object], str]] = [
    ("another-secret", "fetch", _other_secret, "job-store-secrets"),
    ("another-secret-trainer", "trainer", _other_secret, "job-store-secrets"),
    (
        "another-key",
        "fetch",
        lambda j: _set_env(j, {"name": "AWS_ACCESS_KEY_ID", "valueFrom": _secret("s3-models", "password")}),
        "job-env-secrets",
    ),
    (
        "no-route-to-a-store",
        "trainer",
        lambda j: j["spec"]["template"]["metadata"]["labels"].pop("finetune.dev/object-egress"),
        "job-env-secrets",
    ),
    (
        "env-from-secret",
        "fetch",
        lambda j: _container(j).update(envFrom=[{"secretRef": {"name": "db"}}]),
        "job-env-from",
    ),
    (
        "other-variable-from-secret",
        "fetch",
        lambda j: _set_env(j, {"name": "HOME", "valueFrom": _secret("db", "x")}),
        "job-fetch",
    ),
    ("fetch-with-a-gpu", "fetch", lambda j: _limit(j, "nvidia.com/gpu", "1"), "job-fetch"),
    ("fetch-with-a-token", "fetch", lambda j: _pod(j).update(automountServiceAccountToken=True), "job-fetch"),
    (
        "fetch-writing-the-model-claim",
        "fetch",
        lambda j: (
            _pod(j)["volumes"].append({"name": "m", "persistentVolumeClaim": {"claimName": "models"}}),
            _container(j)["volumeMounts"].append({"name": "m", "mountPath": "/mnt/model"}),
        ),
        "job-fetch",
    ),
    ("fetch-another-name", "fetch", lambda j: j["metadata"].update(name="s3-owner-other"), "job-fetch"),
]


@pytest.mark.parametrize(("kind", "change", "rule"), [v[1:] for v in S3_VARIANTS], ids=[v[0] for v in S3_VARIANTS])
def test_an_s3_job_changed_in_one_way_is_refused_naming_its_rule(
    fenced: Fenced, s3_owner: Owner, kind: str, change: Callable[[dict[str, Any]], object], rule: str
) -> None:
    job = _s3_jobs(s3_owner)[kind]
    change(job)
    _assert_rule(fenced.refusal(fenced.batch.create_namespaced_job, job), rule)


def test_a_job_of_a_finetunejob_naming_no_secret_gets_none(fenced: Fenced, s3_owner: Owner) -> None:
    """The S3 fetch Job of another FineTuneJob of the namespace, one that names no Secret."""
    job = _s3_jobs(fenced.owner)["fetch"]
    _assert_rule(fenced.refusal(fenced.batch.create_namespaced_job, job), "job-store-secrets")


# --- namespaces the operator never writes in ------------------------------------------------


@pytest.mark.parametrize("namespace", ["kube-system", "kube-public", "kube-node-lease", SYSTEM_NAMESPACE])
def test_nothing_is_written_in_the_excluded_namespaces(fenced: Fenced, namespace: str) -> None:
    owner = Owner(name="owner", namespace=namespace, uid=fenced.owner.uid)
    there = Fenced(fenced.core.api_client, namespace, owner)
    account, role, _ = rbac_builder.identity(namespace)
    claim = pvc_builder.output_pvc(
        owner, FineTuneJobSpec.model_validate(spec_body(output={"pvc": None, "storage": {"size": "1Gi"}}))
    )
    # (A RoleBinding there meets RBAC's escalation check first: the Role it names does not exist.)
    for create, body in (
        (there.batch.create_namespaced_job, _real_job(owner, "one-node")),
        (there.core.create_namespaced_service_account, account),
        (there.rbac.create_namespaced_role, role),
        (there.core.create_namespaced_persistent_volume_claim, claim),
    ):
        message = there.refusal(create, body)
        _assert_rule(message, "operator-namespaces")
        assert f"in namespace {namespace}" in str(message)


def test_a_finetunejob_in_kube_system_ends_failed_and_gets_no_job(
    cluster: Cluster, kube: client.ApiClient, fenced: Fenced, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("fence-kube-system")
    proc = OperatorProcess(operator_identity(kube, cluster.kubeconfig, folder), "kube-system", folder / "op.log")
    proc.start()
    jobs = Jobs(kube, "kube-system")
    try:
        jobs.create("stray", spec_body())
        jobs.wait_phase("stray", "Failed", 60)
        failed = jobs.condition("stray", "Failed")
        assert failed["reason"] == "NamespaceNotAllowed", failed
        assert "namespace 'kube-system' is one the operator never writes in" in failed["message"]
        assert not _job_exists(jobs, "stray"), "a Job was created in kube-system"
        assert "Traceback" not in proc.tail(200_000)
    finally:
        proc.stop()
        client.CustomObjectsApi(kube).delete_namespaced_custom_object(
            "finetune.dev", "v1alpha1", "kube-system", "finetunejobs", "stray"
        )


# --- the trainer identity -------------------------------------------------------------------


def test_the_trainer_identity_is_admitted(fenced: Fenced) -> None:
    account, role, binding = rbac_builder.identity(fenced.namespace)
    assert fenced.refusal(fenced.core.create_namespaced_service_account, account) is None
    assert fenced.refusal(fenced.rbac.create_namespaced_role, role) is None
    assert fenced.refusal(fenced.rbac.create_namespaced_role_binding, binding) is None


def test_a_rolebinding_to_cluster_admin_is_refused(fenced: Fenced) -> None:
    binding = rbac_builder.role_binding(fenced.namespace)
    binding["roleRef"] = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"}
    _assert_rule(fenced.refusal(fenced.rbac.create_namespaced_role_binding, binding), "rolebinding-role")


@pytest.mark.parametrize(
    "subject",
    [
        {"kind": "ServiceAccount", "name": "default"},
        {"kind": "ServiceAccount", "name": TRAINER_SERVICE_ACCOUNT, "namespace": "kube-system"},
        {"kind": "User", "name": "mallory", "apiGroup": "rbac.authorization.k8s.io"},
        {"kind": "Group", "name": "system:authenticated", "apiGroup": "rbac.authorization.k8s.io"},
    ],
    ids=["other-account", "other-namespace", "user", "group"],
)
def test_a_rolebinding_to_any_other_subject_is_refused(fenced: Fenced, subject: dict[str, str]) -> None:
    binding = rbac_builder.role_binding(fenced.namespace)
    if subject["kind"] == "ServiceAccount":
        subject = {"namespace": fenced.namespace, **subject}
    binding["subjects"] = [subject]
    _assert_rule(fenced.refusal(fenced.rbac.create_namespaced_role_binding, binding), "rolebinding-subject")
    both = rbac_builder.role_binding(fenced.namespace)
    both["subjects"].append(subject)
    _assert_rule(fenced.refusal(fenced.rbac.create_namespaced_role_binding, both), "rolebinding-subject")


def test_a_role_with_any_extra_verb_or_rule_is_refused(fenced: Fenced) -> None:
    role = rbac_builder.role(fenced.namespace)
    role["rules"][0]["verbs"] = ["patch", "get"]
    _assert_rule(fenced.refusal(fenced.rbac.create_namespaced_role, role), "role-rules")
    role = rbac_builder.role(fenced.namespace)
    role["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})
    _assert_rule(fenced.refusal(fenced.rbac.create_namespaced_role, role), "role-rules")
    role = copy.deepcopy(rbac_builder.role(fenced.namespace))
    role["metadata"]["name"] = "other"
    _assert_rule(fenced.refusal(fenced.rbac.create_namespaced_role, role), "role-name")


def test_a_service_account_of_another_name_is_refused(fenced: Fenced) -> None:
    account = rbac_builder.service_account(fenced.namespace)
    account["metadata"]["name"] = "builder"
    _assert_rule(fenced.refusal(fenced.core.create_namespaced_service_account, account), "serviceaccount-name")


# --- claims, services, everything else ------------------------------------------------------


def test_output_claims_are_admitted_and_other_claims_refused(fenced: Fenced) -> None:
    for delete_with_job in (True, False):
        spec = FineTuneJobSpec.model_validate(
            spec_body(output={"pvc": None, "storage": {"size": "1Gi", "deleteWithJob": delete_with_job}})
        )
        claim = pvc_builder.output_pvc(fenced.owner, spec)
        assert claim is not None
        assert fenced.refusal(fenced.core.create_namespaced_persistent_volume_claim, claim) is None, delete_with_job
    foreign = copy.deepcopy(claim)
    foreign["metadata"]["name"] = "data-of-someone"
    _assert_rule(fenced.refusal(fenced.core.create_namespaced_persistent_volume_claim, foreign), "claim-owner")
    clone = copy.deepcopy(claim)
    clone["spec"]["dataSource"] = {"kind": "PersistentVolumeClaim", "name": "secret-data"}
    _assert_rule(fenced.refusal(fenced.core.create_namespaced_persistent_volume_claim, clone), "claim-new-volume")


def test_services_must_be_owned_and_internal(fenced: Fenced) -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "svc", "ownerReferences": [fenced.owner.reference()]},
        "spec": {"ports": [{"port": 80}], "selector": {"a": "b"}},
    }
    assert fenced.refusal(fenced.core.create_namespaced_service, service) is None
    unowned = copy.deepcopy(service)
    del unowned["metadata"]["ownerReferences"]
    _assert_rule(fenced.refusal(fenced.core.create_namespaced_service, unowned), "service-owner")
    exposed = copy.deepcopy(service)
    exposed["spec"]["type"] = "NodePort"
    _assert_rule(fenced.refusal(fenced.core.create_namespaced_service, exposed), "service-internal")


# --- NetworkPolicies: a job's own, no broader -------------------------------------------------

NETWORK_SETTINGS = dataclasses.replace(
    FENCE_SETTINGS,
    trainer_network=from_env({SETTINGS["trainer_network"].env: json.dumps(TRAINER_NETWORK)}).trainer_network,
)


def _network_policy(owner: Owner, kind: str) -> dict[str, Any]:
    """A job's own policy: only a job of several nodes has one."""
    rules = NETWORK_SETTINGS.trainer_network
    assert rules is not None
    policy = network_builder.job_policy(owner, FineTuneJobSpec.model_validate(REAL_JOBS[kind]), rules)
    assert policy is not None, kind
    return policy


def _shared_policies(namespace: str) -> dict[str, dict[str, Any]]:
    rules = NETWORK_SETTINGS.trainer_network
    assert rules is not None
    return {p["metadata"]["name"]: p for p in network_builder.namespace_policies(namespace, rules)}


def test_the_operators_real_network_policies_are_admitted(fenced: Fenced) -> None:
    """The namespace's two shared policies (every trainer; the Hub jobs' pods) and a multi-node
    job's own pass."""
    policies = [*_shared_policies(fenced.namespace).values(), _network_policy(fenced.owner, "multi-node")]
    assert [p["metadata"]["name"] for p in policies] == [
        network_builder.TRAINERS,
        network_builder.HUB_TRAINERS,
        f"{fenced.owner.name}-network",
    ]
    for policy in policies:
        assert fenced.refusal(fenced.networking.create_namespaced_network_policy, policy) is None


def _egress(policy: dict[str, Any]) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = policy["spec"]["egress"]
    return rules


def _ingress(policy: dict[str, Any]) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = policy["spec"]["ingress"]
    return rules


ANYWHERE = {"ipBlock": {"cidr": "0.0.0.0/0"}}
OTHER_JOB = {"podSelector": {"matchLabels": {"finetune.dev/job": "other"}}}
# (what the variant changes, the change to the multi-node job's policy, the rule that refuses it)
NETWORK_VARIANTS: list[tuple[str, Callable[[dict[str, Any]], object], str]] = [
    ("selects-all-pods", lambda p: p["spec"].update(podSelector={}), "networkpolicy-pods"),
    (
        "selects-another-job",
        lambda p: p["spec"]["podSelector"]["matchLabels"].update({"finetune.dev/job": "other"}),
        "networkpolicy-pods",
    ),
    ("egress-anywhere-any-port", lambda p: _egress(p).append({"to": [ANYWHERE]}), "networkpolicy-egress"),
    ("egress-everything", lambda p: _egress(p).append({}), "networkpolicy-egress"),
    (
        "egress-anywhere-on-443",
        lambda p: _egress(p).append({"to": [ANYWHERE], "ports": [{"protocol": "TCP", "port": 443}]}),
        "networkpolicy-egress",
    ),
    (
        "egress-to-another-job",
        lambda p: _egress(p)[-1].update(to=[OTHER_JOB]),
        "networkpolicy-egress",
    ),
    (
        "egress-to-another-namespace",
        lambda p: _egress(p)[-1]["to"][0].update(namespaceSelector={}),
        "networkpolicy-egress",
    ),
    (
        "egress-on-all-ports",
        lambda p: _egress(p)[-1].pop("ports"),
        "networkpolicy-egress",
    ),
    ("ingress-from-everywhere", lambda p: _ingress(p).append({}), "networkpolicy-ingress"),
    ("ingress-from-another-job", lambda p: _ingress(p)[0].update({"from": [OTHER_JOB]}), "networkpolicy-ingress"),
    (
        "ingress-on-another-port",
        lambda p: _ingress(p)[0].update(ports=[{"protocol": "TCP", "port": 22}]),
        "networkpolicy-ingress",
    ),
    ("unowned", lambda p: p["metadata"].pop("ownerReferences"), "networkpolicy-owner"),
    ("another-name", lambda p: p["metadata"].update(name="wide-open"), "networkpolicy-owner"),
    ("egress-only", lambda p: p["spec"].update(policyTypes=["Egress"]), "networkpolicy-types"),
]
# The same, for the namespace's shared policy of every trainer pod.
SHARED_VARIANTS: list[tuple[str, Callable[[dict[str, Any]], object], str]] = [
    ("selects-all-pods", lambda p: p["spec"].update(podSelector={}), "networkpolicy-pods"),
    (
        "selects-every-operator-pod",
        lambda p: p["spec"]["podSelector"]["matchLabels"].pop("finetune.dev/component"),
        "networkpolicy-pods",
    ),
    (
        "selects-by-expression-too",
        lambda p: p["spec"]["podSelector"].update(matchExpressions=[{"key": "team", "operator": "Exists"}]),
        "networkpolicy-pods",
    ),
    ("ingress-from-everywhere", lambda p: _ingress(p).append({}), "networkpolicy-ingress"),
    ("ingress-from-own-pods", lambda p: _ingress(p).append({"from": [OTHER_JOB]}), "networkpolicy-ingress"),
    ("egress-anywhere-on-443", lambda p: _egress(p).append({"to": [ANYWHERE]}), "networkpolicy-egress"),
    (
        "egress-to-a-job-on-its-ports",
        lambda p: _egress(p).append({"to": [OTHER_JOB], "ports": TRAINER_NETWORK["peerPorts"]}),
        "networkpolicy-egress",
    ),
    ("ingress-left-open", lambda p: p["spec"].update(policyTypes=["Egress"]), "networkpolicy-types"),
    ("owned-by-a-job", lambda p: p["metadata"].update(ownerReferences=[OWNER_REF]), "networkpolicy-owner"),
    (
        "labelled-as-a-job",
        lambda p: p["metadata"]["labels"].update({"finetune.dev/job": "tiny"}),
        "networkpolicy-owner",
    ),
]
OWNER_REF = {
    "apiVersion": "finetune.dev/v1alpha1",
    "kind": "FineTuneJob",
    "name": "tiny",
    "uid": "u",
    "controller": True,
}


@pytest.fixture(scope="module")
def network_fence(kube: client.ApiClient, fenced: Fenced) -> Fenced:
    """The fenced token once the NetworkPolicy fence reads its parameter. The binding admits
    everything while the API server has not found the chart's rules object (Allow: see
    files/operator-fence-policy.yaml), so the chart's objects are (re)applied as the chart
    installs them and the fence is seen to refuse a policy selecting all pods before any case."""
    from tests.support.install import operator_fence_install

    operator_fence_install(kube)
    wide = _network_policy(fenced.owner, "multi-node")
    wide["spec"]["podSelector"] = {}
    wait_for(lambda: fenced.refusal(fenced.networking.create_namespaced_network_policy, wide), 60, "the fence's rules")
    return fenced


@pytest.mark.parametrize(("variant", "change", "rule"), NETWORK_VARIANTS, ids=[v[0] for v in NETWORK_VARIANTS])
def test_a_broader_network_policy_is_refused_naming_its_rule(
    network_fence: Fenced, variant: str, change: Callable[[dict[str, Any]], object], rule: str
) -> None:
    """With the operator's token: a policy that selects all pods, opens egress to 0.0.0.0/0, lets
    another job's pods in or names them as peers is refused. (The local cluster runs no network
    plugin, so nothing here is enforced on traffic: these are the objects, and their admission.)"""
    fenced = network_fence
    policy = _network_policy(fenced.owner, "multi-node")
    assert fenced.refusal(fenced.networking.create_namespaced_network_policy, policy) is None
    change(policy)
    _assert_rule(fenced.refusal(fenced.networking.create_namespaced_network_policy, policy), rule)


@pytest.mark.parametrize(("variant", "change", "rule"), SHARED_VARIANTS, ids=[v[0] for v in SHARED_VARIANTS])
def test_a_broader_shared_network_policy_is_refused_naming_its_rule(
    network_fence: Fenced, variant: str, change: Callable[[dict[str, Any]], object], rule: str
) -> None:
    """The namespace's policy of every trainer pod, made broader in one way, is refused: it
    selects the trainer pods alone, lets nothing in and nothing out past the chart's rules."""
    fenced = network_fence
    policy = copy.deepcopy(_shared_policies(fenced.namespace)[network_builder.TRAINERS])
    change(policy)
    _assert_rule(fenced.refusal(fenced.networking.create_namespaced_network_policy, policy), rule)


def test_the_hub_rule_goes_only_to_the_hub_jobs_pods(network_fence: Fenced) -> None:
    """The shared Hub policy selects the pods labelled finetune.dev/hub-egress, no others."""
    fenced = network_fence
    policy = copy.deepcopy(_shared_policies(fenced.namespace)[network_builder.HUB_TRAINERS])
    policy["spec"]["podSelector"]["matchLabels"].pop("finetune.dev/hub-egress")
    _assert_rule(fenced.refusal(fenced.networking.create_namespaced_network_policy, policy), "networkpolicy-pods")


def _rewards_policy(owner: Owner) -> dict[str, Any]:
    """A GRPO job's policy to the Service its http reward calls, as the operator builds it from
    the Service it read (a named target port, as a Service may have)."""
    judge = {"spec": {"selector": {"app": "judge"}, "ports": [{"port": 8080, "targetPort": "http", "protocol": "TCP"}]}}
    call = ServiceUrl("spec.training.grpo.rewards[0].http.url", "a reward service", "judge", None, 8080)
    egress, waiting = network_builder.service_egress((call,), {"judge": judge}, fenced=True)
    policy = network_builder.services_policy(owner, egress)
    assert waiting is None and policy is not None
    return policy


def _to(policy: dict[str, Any]) -> dict[str, Any]:
    peer: dict[str, Any] = policy["spec"]["egress"][0]["to"][0]
    return peer


# (what the variant changes, the change to a job's policy to its reward Services, the rule that refuses it)
REWARDS_VARIANTS: list[tuple[str, Callable[[dict[str, Any]], object], str]] = [
    ("selects-all-pods", lambda p: p["spec"].update(podSelector={}), "networkpolicy-pods"),
    ("unowned", lambda p: p["metadata"].pop("ownerReferences"), "networkpolicy-owner"),
    ("another-suffix", lambda p: p["metadata"].update(name=f"{p['metadata']['name']}-more"), "networkpolicy-owner"),
    ("ingress-from-everywhere", lambda p: _ingress(p).append({}), "networkpolicy-ingress"),
    ("ingress-left-open", lambda p: p["spec"].update(policyTypes=["Egress"]), "networkpolicy-types"),
    ("egress-to-another-namespace", lambda p: _to(p).update(namespaceSelector={}), "networkpolicy-services"),
    (
        "egress-to-an-address",
        lambda p: _egress(p).append({"to": [ANYWHERE], "ports": [{"port": 443}]}),
        "networkpolicy-services",
    ),
    ("egress-to-every-pod", lambda p: _to(p).update(podSelector={}), "networkpolicy-services"),
    (
        "egress-by-expression",
        lambda p: _to(p)["podSelector"].update(matchExpressions=[{"key": "app", "operator": "Exists"}]),
        "networkpolicy-services",
    ),
    ("egress-on-every-port", lambda p: _egress(p)[0].pop("ports"), "networkpolicy-services"),
    (
        "egress-on-a-range",
        lambda p: _egress(p)[0].update(ports=[{"protocol": "TCP", "port": 1, "endPort": 65535}]),
        "networkpolicy-services",
    ),
    ("egress-anywhere", lambda p: _egress(p).append({}), "networkpolicy-services"),
]


def test_a_jobs_policy_to_its_reward_services_is_admitted(network_fence: Fenced) -> None:
    """`<job>-rewards`, as the builder makes it: the job's pods, nothing in, out only to the
    Service's pods on its target port."""
    fenced = network_fence
    policy = _rewards_policy(fenced.owner)
    assert policy["metadata"]["name"] == f"{fenced.owner.name}-rewards"
    assert fenced.refusal(fenced.networking.create_namespaced_network_policy, policy) is None


@pytest.mark.parametrize(("variant", "change", "rule"), REWARDS_VARIANTS, ids=[v[0] for v in REWARDS_VARIANTS])
def test_a_broader_policy_to_reward_services_is_refused_naming_its_rule(
    network_fence: Fenced, variant: str, change: Callable[[dict[str, Any]], object], rule: str
) -> None:
    fenced = network_fence
    policy = _rewards_policy(fenced.owner)
    change(policy)
    _assert_rule(fenced.refusal(fenced.networking.create_namespaced_network_policy, policy), rule)


def test_any_other_write_is_refused_naming_the_rule(fenced: Fenced) -> None:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "b"}}
    message = fenced.refusal(fenced.core.create_namespaced_config_map, config_map)
    _assert_rule(message, "operator-kinds")
    assert "may not CREATE configmaps" in str(message)
    pod_spec = {**_pod(fenced.job()), "serviceAccountName": "default"}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": pod_spec}
    _assert_rule(fenced.refusal(fenced.core.create_namespaced_pod, pod), "operator-kinds")


def _lease(name: str) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}, "spec": {}}


def test_a_lease_only_in_the_operators_own_namespace(fenced: Fenced) -> None:
    """Its leader-election Lease is the one write it makes in its own namespace (RBAC grants it
    there, files/operator-leader-rbac.yaml); a Lease anywhere else, say in a tenant's namespace
    where RBAC was widened, is refused by the fence."""
    coordination = client.CoordinationV1Api(fenced.core.api_client)
    own = Fenced(fenced.core.api_client, SYSTEM_NAMESPACE, fenced.owner)
    assert own.refusal(coordination.create_namespaced_lease, _lease(TEST_LEASE)) is None
    message = fenced.refusal(coordination.create_namespaced_lease, _lease(TEST_LEASE))
    _assert_rule(message, "operator-leases")
    assert f"not in {fenced.namespace}" in str(message)


def test_the_operator_cannot_delete_even_with_rbac_to(kube: client.ApiClient, fenced: Fenced) -> None:
    victim = fenced.job()
    victim["metadata"]["name"] = "victim"
    victim["spec"]["suspend"] = True
    client.BatchV1Api(kube).create_namespaced_job(fenced.namespace, victim)
    try:
        fenced.batch.delete_namespaced_job("victim", fenced.namespace, dry_run="All")
    except ApiException as exc:
        _assert_rule(str(exc.body), "operator-kinds")
        assert "may not DELETE jobs.batch" in str(exc.body)
    else:
        pytest.fail("the operator deleted a Job")


def test_admin_is_not_fenced(kube: client.ApiClient, fenced: Fenced) -> None:
    """The fence matches the operator's user only: the same Job from an admin is admitted."""
    job = fenced.job("docker.io/library/busybox:latest")
    _pod(job)["serviceAccountName"] = "default"
    client.BatchV1Api(kube).create_namespaced_job(fenced.namespace, job, dry_run="All")


# --- the allow-list rule, CEL against Python ------------------------------------------------

CASE_ACCOUNT = "fence-image-cases"


@pytest.fixture(scope="module")
def image_cases(cluster: Cluster, kube: client.ApiClient, fenced: Fenced) -> Iterator[Fenced]:
    """A copy of the fence's Job policy, with PATTERNS as its list, for an account of its own."""
    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    namespace = fenced.namespace
    core.create_namespaced_service_account(namespace, {"metadata": {"name": CASE_ACCOUNT}})
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": CASE_ACCOUNT},
            "rules": [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": CASE_ACCOUNT},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": CASE_ACCOUNT},
            "subjects": [{"kind": "ServiceAccount", "name": CASE_ACCOUNT, "namespace": namespace}],
        },
    )
    user = f"system:serviceaccount:{namespace}:{CASE_ACCOUNT}"
    objects = operator_fence_policies(user, PATTERNS)[:2]
    assert objects[0]["metadata"]["name"] == "finetune-fence-jobs"
    name = f"fence-image-cases-{namespace}"
    objects[0]["metadata"]["name"] = objects[1]["metadata"]["name"] = objects[1]["spec"]["policyName"] = name
    admission_policies_install(kube, objects)
    admission = client.AdmissionregistrationV1Api(kube)
    probe = Fenced(token_client(cluster, core, namespace, CASE_ACCOUNT), namespace, fenced.owner)
    # A new policy takes a moment to reach the admission plugin: wait for it to refuse.
    wait_for(
        lambda: probe.refusal(probe.batch.create_namespaced_job, probe.job("docker.io/x/y:1")), 30, "the case policy"
    )
    yield probe
    admission.delete_validating_admission_policy_binding(name)
    admission.delete_validating_admission_policy(name)


def test_cel_and_python_read_every_image_alike(image_cases: Fenced) -> None:
    disagree = []
    for image, allowed in CASES:
        message = image_cases.refusal(image_cases.batch.create_namespaced_job, image_cases.job(image))
        if (message is None) != allowed:
            disagree.append(f"{image}: Python says {'allowed' if allowed else 'refused'}, admission: {message}")
    assert not disagree, "\n".join(disagree)


# --- the operator itself --------------------------------------------------------------------


def test_a_job_with_a_disallowed_image_fails_with_image_not_allowed_and_gets_no_job(
    cluster: Cluster, kube: client.ApiClient, fenced: Fenced, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("fence-operator")
    proc = OperatorProcess(operator_identity(kube, cluster.kubeconfig, folder), fenced.namespace, folder / "op.log")
    proc.start()
    try:
        jobs = Jobs(kube, fenced.namespace)
        jobs.create("evil", spec_body(image="docker.io/evil/miner:latest"))
        status = jobs.wait_phase("evil", "Failed", 60)
        failed = jobs.condition("evil", "Failed")
        assert failed["reason"] == "ImageNotAllowed", status
        assert "spec.image: 'docker.io/evil/miner:latest' is not in the trainer image allow-list" in failed["message"]
        assert jobs.events_with("evil", "ImageNotAllowed")
        # The owner job next to it (allowed image, default) gets its first Job, the input check:
        # the fence admits it. (Its claims are not in this namespace, so the check waits there.)
        wait_for(lambda: _job_exists(jobs, contract.preflight_job_name("owner")), 60, "the allowed job's Job")
        assert not _job_exists(jobs, "evil"), "a Job was created for a disallowed image"
        assert not _job_exists(jobs, contract.preflight_job_name("evil")), "an input check for a disallowed image"
        assert "Traceback" not in proc.tail(200_000)
    finally:
        proc.stop()


def _job_exists(jobs: Jobs, name: str) -> bool:
    try:
        jobs.batch.read_namespaced_job(name, jobs.namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def test_without_widened_rbac_the_escalation_check_refuses_first(
    cluster: Cluster, kube: client.ApiClient, fenced: Fenced, namespace: str
) -> None:
    """With the chart's own RBAC (no `bind`, no `escalate`), RBAC refuses a binding to
    cluster-admin before admission is asked: two layers, and the fence is the one that holds
    when the first is loosened (the tests above)."""
    token = token_client(cluster, client.CoreV1Api(kube), SYSTEM_NAMESPACE, OPERATOR_SA)
    plain = Fenced(token, namespace, fenced.owner)
    binding = rbac_builder.role_binding(namespace)
    binding["roleRef"] = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"}
    message = plain.refusal(plain.rbac.create_namespaced_role_binding, binding)
    assert message is not None and "attempting to grant RBAC permissions not currently held" in message, message
    # The trainer's own binding goes through both layers.
    account, role, own = rbac_builder.identity(namespace)
    assert plain.refusal(plain.core.create_namespaced_service_account, account) is None
    plain.rbac.create_namespaced_role(namespace, role)
    assert plain.refusal(plain.rbac.create_namespaced_role_binding, own) is None

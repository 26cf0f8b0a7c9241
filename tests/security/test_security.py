"""Security, proven on the real control plane:

- `kubectl auth can-i --list` for the operator's ServiceAccount (RBAC as the chart renders it)
  and for a job's trainer ServiceAccount (RBAC as the operator creates it) is exactly the
  intended list, beyond what every authenticated account may do anyway;
- Pod Security `restricted` admits the operator's pod and the trainer's pod (and, as the
  control, refuses a privileged one); neither has hostPath, privileged, host namespaces or root;
- a Hub token is in its Secret and nowhere else: no other object, no log.
"""

import base64
import json
import re
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.resource import ResourceList

from finetune_api.constants import TRAINER_SERVICE_ACCOUNT
from hack.cluster import binaries
from hack.cluster.binaries import K8S_VERSION
from tests.fixtures.cluster import Cluster
from tests.support.harness import Jobs, OperatorProcess, operator_identity, wait_for
from tests.support.helm import helm, template_args

pytestmark = pytest.mark.cluster

RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}

# What the operator may do where it watches: the security contract, written out by hand so
# that a widened rules file fails here instead of slipping through.
# Read-only: the GPU nodes' product and allocatable GPUs and memory, held in the watch cache
# (whether any node can ever hold a job: Schedulable), and the labels an Unschedulable message names
# (the pending timeout's "nodes have: Tesla-P40 x 12, ..."). It is in the rules of the namespaces
# the operator serves; nodes being cluster-scoped, a namespace's Role (this test's namespaced mode)
# lists it but grants nothing.
CLUSTER_READ: dict[tuple[str, tuple[str, ...]], frozenset[str]] = {("nodes", ()): frozenset({"get", "list", "watch"})}
OPERATOR_CAN: dict[tuple[str, tuple[str, ...]], frozenset[str]] = {
    ("finetunejobs.finetune.dev", ()): frozenset({"get", "list", "watch"}),
    ("finetunejobs.finetune.dev/status", ()): frozenset({"patch"}),
    ("jobs.batch", ()): frozenset({"get", "list", "watch", "create", "patch"}),
    # ModelServers: read, their status written; their Deployments made, applied again and watched.
    ("modelservers.finetune.dev", ()): frozenset({"get", "list", "watch"}),
    ("modelservers.finetune.dev/status", ()): frozenset({"patch"}),
    ("deployments.apps", ()): frozenset({"get", "list", "watch", "create", "patch"}),
    ("pods", ()): frozenset({"get", "list", "watch"}),
    ("serviceaccounts", ()): frozenset({"get", "create"}),
    ("persistentvolumeclaims", ()): frozenset({"get", "create"}),
    # The headless Service of a job of several nodes, and a ModelServer's.
    ("services", ()): frozenset({"get", "create"}),
    ("roles.rbac.authorization.k8s.io", ()): frozenset({"get", "create"}),
    ("rolebindings.rbac.authorization.k8s.io", ()): frozenset({"get", "create"}),
    # The trainers' NetworkPolicies (the namespace's and a multi-node job's), held by the fence to their shapes.
    ("networkpolicies.networking.k8s.io", ()): frozenset({"get", "create"}),
    # Created on FineTuneJobs; read only as the Job controller's FailedCreate (a quota's refusal).
    ("events", ()): frozenset({"create", "list", "watch"}),
    # Kueue's Workload of a queued job's Job: read only, for the job's status.
    ("workloads.kueue.x-k8s.io", ()): frozenset({"get", "list", "watch"}),
    **CLUSTER_READ,
}


# A trainer patches FineTuneJob status, nothing else; the chart's admission policy narrows the
# patch to its own job (tests/operator/test_e2e_placement.py proves that part).
TRAINER_CAN: dict[tuple[str, tuple[str, ...]], frozenset[str]] = {
    ("finetunejobs.finetune.dev/status", ()): frozenset({"patch"})
}


Rights = dict[tuple[str, tuple[str, ...]], frozenset[str]]
_ROW = re.compile(r"^\s*(\S*?)\s*\[([^\]]*)\]\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s*$")


def kubectl(cluster: Cluster, *args: str, stdin: str | None = None, check: bool = True) -> str:
    found = binaries.resolve("kubectl")
    assert found is not None, "kubectl is missing: `make cluster-up` builds it"
    result = subprocess.run(
        [str(found), "--kubeconfig", str(cluster.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}{result.stdout}")
    return result.stdout + result.stderr


def can_i_list(cluster: Cluster, account: str, namespace: str) -> Rights:
    """`kubectl auth can-i --list` as a ServiceAccount, as {(resource or URL, names): verbs}."""
    out = kubectl(cluster, "auth", "can-i", "--list", f"--as={account}", "-n", namespace)
    rights: dict[tuple[str, tuple[str, ...]], set[str]] = {}
    for line in out.splitlines()[1:]:
        match = _ROW.match(line)
        assert match, f"unexpected can-i line: {line!r}"
        resource, urls, names, verbs = match.groups()
        key = (resource or urls, tuple(names.split()))
        rights.setdefault(key, set()).update(verbs.split())
    return {k: frozenset(v) for k, v in rights.items()}


def beyond_baseline(rights: Rights, baseline: Rights) -> Rights:
    return {k: v - baseline.get(k, frozenset()) for k, v in rights.items() if v - baseline.get(k, frozenset())}


@pytest.fixture(scope="module")
def spaces(cluster: Cluster, kube: client.ApiClient) -> Iterator[tuple[str, str, str]]:
    """(operator namespace, restricted job namespace, an unrelated namespace)."""
    core = client.CoreV1Api(kube)
    suffix = uuid.uuid4().hex[:6]
    names = (f"sec-op-{suffix}", f"sec-jobs-{suffix}", f"sec-other-{suffix}")
    for name in names:
        core.create_namespace({"metadata": {"name": name, "labels": {**RESTRICTED, "finetune.dev/test": "true"}}})
    for name in names:
        wait_for(lambda n=name: _exists(lambda: core.read_namespaced_service_account("default", n)), 30, "default SA")
    yield names
    for name in names:
        core.delete_namespace(name, propagation_policy="Background")


def _exists(read: Any) -> bool:
    try:
        read()
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


@pytest.fixture(scope="module")
def chart_objects(spaces: tuple[str, str, str]) -> list[dict[str, Any]]:
    operator_ns, job_ns, _ = spaces
    args = template_args(sets=["watch.mode=namespaced", f"watch.namespaces={{{job_ns}}}"], namespace=operator_ns)
    out = helm(*args, "--kube-version", K8S_VERSION).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _operator_account(objects: list[dict[str, Any]]) -> tuple[str, str]:
    account = next(o for o in objects if o["kind"] == "ServiceAccount")
    return account["metadata"]["namespace"], account["metadata"]["name"]


def test_operator_can_do_exactly_what_it_needs(
    cluster: Cluster, spaces: tuple[str, str, str], chart_objects: list[dict[str, Any]]
) -> None:
    _, job_ns, other_ns = spaces
    rbac = [
        o
        for o in chart_objects
        if o["kind"] in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
    ]
    kubectl(cluster, "apply", "-f", "-", stdin=yaml.safe_dump_all(rbac))
    namespace, name = _operator_account(chart_objects)
    account = f"system:serviceaccount:{namespace}:{name}"
    kubectl(cluster, "create", "serviceaccount", "nobody", "-n", other_ns, check=False)
    baseline = can_i_list(cluster, f"system:serviceaccount:{other_ns}:nobody", other_ns)

    where_it_watches = beyond_baseline(can_i_list(cluster, account, job_ns), baseline)
    assert where_it_watches == OPERATOR_CAN, json.dumps(
        {"extra": _show(where_it_watches, OPERATOR_CAN), "missing": _show(OPERATOR_CAN, where_it_watches)}, indent=1
    )
    elsewhere = beyond_baseline(can_i_list(cluster, account, other_ns), baseline)
    assert elsewhere == {}, f"the operator has rights outside its namespaces: {_show(elsewhere, {})}"
    assert all("*" not in key[0] and "*" not in verbs for key, verbs in where_it_watches.items())


def _show(a: Rights, b: Rights) -> dict[str, list[str]]:
    return {
        f"{k[0]}{list(k[1]) if k[1] else ''}": sorted(v - b.get(k, frozenset()))
        for k, v in a.items()
        if v - b.get(k, frozenset())
    }


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster, kube: client.ApiClient, spaces: tuple[str, str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    folder = tmp_path_factory.mktemp("security")
    config = operator_identity(kube, cluster.kubeconfig, folder)
    proc = OperatorProcess(config, spaces[1], folder / "operator.log").start()
    yield proc
    proc.stop()


GPU_SPEC: dict[str, Any] = {
    "model": {"source": {"hub": {"id": "org/model", "tokenSecret": "hub-token"}}},
    "dataset": {"source": {"hub": {"id": "org/data", "tokenSecret": "hub-token"}}, "format": "alpaca"},
    "output": {"storage": {"size": "1Gi"}},
    "resources": {"gpus": 4, "gpuProduct": "Tesla-P40"},
    "training": {"maxSteps": 2},
}


@pytest.fixture(scope="module")
def hub_job(kube: client.ApiClient, spaces: tuple[str, str, str], operator: OperatorProcess) -> tuple[str, str]:
    """A job that downloads from the Hub with a token; returns (job name, token)."""
    _, job_ns, _ = spaces
    token = "hf_" + secrets.token_urlsafe(24)
    client.CoreV1Api(kube).create_namespaced_secret(
        job_ns, {"metadata": {"name": "hub-token"}, "stringData": {"token": token}}
    )
    jobs = Jobs(kube, job_ns)
    jobs.create("hub", GPU_SPEC)
    wait_for(lambda: jobs.pods("hub"), 90, "a trainer pod of job hub")
    jobs.wait_phase("hub", ("Running", "Succeeded", "Failed"), 120)
    return "hub", token


def test_trainer_account_can_only_touch_its_own_status(
    cluster: Cluster, spaces: tuple[str, str, str], hub_job: tuple[str, str]
) -> None:
    _, job_ns, other_ns = spaces
    baseline = can_i_list(cluster, f"system:serviceaccount:{other_ns}:nobody", other_ns)
    account = f"system:serviceaccount:{job_ns}:{TRAINER_SERVICE_ACCOUNT}"
    rights = beyond_baseline(can_i_list(cluster, account, job_ns), baseline)
    assert rights == TRAINER_CAN, _show(rights, {})
    elsewhere = beyond_baseline(can_i_list(cluster, account, other_ns), baseline)
    assert elsewhere == {}, _show(elsewhere, {})


def _pod_problems(pod_spec: dict[str, Any]) -> list[str]:
    """What `restricted` forbids and what we promise beyond it, read from a pod spec."""
    problems = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(key):
            problems.append(key)
    problems += [f"hostPath volume {v['name']}" for v in pod_spec.get("volumes") or [] if "hostPath" in v]
    pod_ctx = pod_spec.get("securityContext") or {}
    for container in (pod_spec.get("initContainers") or []) + pod_spec["containers"]:
        ctx = container.get("securityContext") or {}
        name = container["name"]
        if ctx.get("privileged"):
            problems.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation not false")
        if not (ctx.get("runAsNonRoot") or pod_ctx.get("runAsNonRoot")):
            problems.append(f"{name}: runAsNonRoot not set")
        if (ctx.get("runAsUser", pod_ctx.get("runAsUser")) or 1) == 0:
            problems.append(f"{name}: runs as uid 0")
        if "ALL" not in ((ctx.get("capabilities") or {}).get("drop") or []):
            problems.append(f"{name}: capabilities not dropped")
        if (ctx.get("capabilities") or {}).get("add"):
            problems.append(f"{name}: adds capabilities")
    return problems


def _not_looking_up_the_account(refused: ApiException | None) -> tuple[ApiException | None] | None:
    """The dry run's answer, unless it is admission not yet seeing the pod's ServiceAccount."""
    if refused is not None and "error looking up service account" in str(refused.body):
        return None
    return (refused,)


def _dry_run_pod(core: client.CoreV1Api, namespace: str, name: str, pod_spec: dict[str, Any]) -> ApiException | None:
    try:
        core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": pod_spec}, dry_run="All")
    except ApiException as exc:
        return exc
    return None


def test_restricted_admits_the_operator_pod(
    kube: client.ApiClient, spaces: tuple[str, str, str], chart_objects: list[dict[str, Any]]
) -> None:
    operator_ns, _, _ = spaces
    core = client.CoreV1Api(kube)
    deployment = next(o for o in chart_objects if o["kind"] == "Deployment")
    pod_spec = deployment["spec"]["template"]["spec"]
    assert _pod_problems(pod_spec) == []
    # The pod names the chart's ServiceAccount: this test makes it rather than relying on the RBAC
    # test before it, and waits until admission sees it (its informer lagged behind the create
    # once, with four test workers on two cores: "error looking up service account").
    account = next(o for o in chart_objects if o["kind"] == "ServiceAccount")
    try:
        core.create_namespaced_service_account(operator_ns, {"metadata": {"name": account["metadata"]["name"]}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    refused = wait_for(
        lambda: _not_looking_up_the_account(_dry_run_pod(core, operator_ns, "operator", pod_spec)),
        30,
        "admission to see the operator's ServiceAccount",
    )[0]
    assert refused is None, f"restricted refused the operator pod: {refused.body if refused else ''}"
    # The control: the same namespace refuses a pod that breaks the profile.
    privileged = {"containers": [{"name": "x", "image": "x", "securityContext": {"privileged": True}}]}
    refused = _dry_run_pod(core, operator_ns, "privileged", privileged)
    assert refused is not None and refused.status == 403 and "violates PodSecurity" in str(refused.body)


def test_restricted_admits_the_trainer_pod(
    kube: client.ApiClient, spaces: tuple[str, str, str], hub_job: tuple[str, str]
) -> None:
    _, job_ns, _ = spaces
    jobs = Jobs(kube, job_ns)
    pods = jobs.pods(hub_job[0])
    assert pods, "no trainer pod was admitted"
    assert _pod_problems(pods[0]["spec"]) == []
    failed_creates = [e for e in jobs.core.list_namespaced_event(job_ns).items if e.reason == "FailedCreate"]
    assert not failed_creates, [e.message for e in failed_creates]


# Why a kind that discovery lists may still not be listed, by the API server's answer: the kind
# went away since discovery (a CRD another test removed), its verb is not served, or its
# aggregated API server is not answering. Anything else, a refusal included, means the scan did
# not look where it says it looked.
UNLISTABLE = {404: "gone since discovery", 405: "list not served", 503: "its API server not answering"}


def why_unlistable(error: Exception) -> str:
    """The reason a kind could not be listed, or the error itself when it is none of those known."""
    if isinstance(error, ApiException) and error.status in UNLISTABLE:
        return UNLISTABLE[error.status]
    raise error


def test_hub_token_only_in_its_secret(
    cluster: Cluster,
    kube: client.ApiClient,
    spaces: tuple[str, str, str],
    hub_job: tuple[str, str],
    operator: OperatorProcess,
) -> None:
    _, job_ns, _ = spaces
    _, token = hub_job
    needles = (token, base64.b64encode(token.encode()).decode())
    api = dynamic.DynamicClient(kube)
    found: list[str] = []
    skipped: list[str] = []
    checked = 0
    for resource in api.resources.search():
        if not resource.namespaced or "list" not in (resource.verbs or []) or "/" in resource.name:
            continue
        if isinstance(resource, ResourceList):
            continue  # discovery's `<Kind>List` entries: each lists a kind this loop lists anyway
        try:
            items = resource.get(namespace=job_ns).to_dict().get("items") or []
        except ApiException as e:
            skipped.append(f"{resource.kind}: {why_unlistable(e)}")
            continue
        for item in items:
            checked += 1
            meta = item.get("metadata") or {}
            if resource.kind == "Secret" and meta.get("name") == "hub-token":
                assert any(n in json.dumps(item) for n in needles), "the Secret should hold the token"
                continue
            text = json.dumps(item)
            if any(n in text for n in needles):
                found.append(f"{resource.kind}/{meta.get('name')}")
    assert checked > 5, f"listed too few objects to mean anything (skipped: {skipped})"
    assert not found, f"hub token found in: {found}"
    logs = [
        operator.log,
        *sorted(Path(cluster.layout.logs).glob("*.log")),
        *sorted(Path(cluster.layout.pods).glob("*/*.log")),
    ]
    leaking = [str(p) for p in logs if p.is_file() and any(n in p.read_text(errors="replace") for n in needles)]
    assert not leaking, f"hub token in logs: {leaking}"

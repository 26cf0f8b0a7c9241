"""Tenants on the real API server: the chart's aggregated ClusterRoles reach the built-in
`view`, `edit` and `admin` roles, so the RoleBinding a platform team already makes per team
namespace is all a team needs to use FineTuneJobs."""

import time
import uuid
from collections.abc import Iterator

import pytest

from finetune_operator.builders import rbac
from tests.chart.test_install import CRD_FILE, RESTRICTED, Kube
from tests.fixtures.cluster import Cluster
from tests.support import docs
from tests.support.helm import by_kind, render

pytestmark = pytest.mark.cluster

JOBS = "finetunejobs.finetune.dev"
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"
READ, WRITE = ("get", "list", "watch"), ("create", "update", "patch", "delete", "deletecollection")


@pytest.fixture(scope="module")
def team(cluster: Cluster) -> Iterator[tuple[Kube, str]]:
    """A team namespace where `alice` holds the built-in `edit`, `bob` `view` and `carol` `admin`,
    with the chart's tenant roles applied as `helm install` would."""
    kubectl = Kube(cluster.kubeconfig)
    suffix = uuid.uuid4().hex[:6]
    namespace, release = f"team-{suffix}", f"tenants-{suffix}"
    tenant_roles = [
        role
        for role in by_kind(render(sets=[f"fullnameOverride={release}"]), "ClusterRole")
        if any(label.startswith(AGGREGATE) for label in role["metadata"]["labels"])
    ]
    assert len(tenant_roles) == 2
    # RBAC answers for any resource name, but kubectl asks only about kinds the server serves.
    kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    kubectl.namespace(namespace, RESTRICTED)
    kubectl.apply(tenant_roles)
    bindings = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{user}-{role}", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
        for user, role in (("alice", "edit"), ("bob", "view"), ("carol", "admin"))
    ]
    kubectl.apply(bindings)
    # The controller manager aggregates asynchronously.
    deadline = time.monotonic() + 60
    while not kubectl.can_i("alice", "create", JOBS, "-n", namespace) and time.monotonic() < deadline:
        time.sleep(1)
    yield kubectl, namespace
    kubectl.run("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)
    for role in tenant_roles:
        kubectl.run("delete", "clusterrole", role["metadata"]["name"], "--ignore-not-found", check=False)


@pytest.mark.parametrize("user", ["alice", "carol"], ids=["edit", "admin"])
def test_edit_and_admin_may_do_everything_to_finetunejobs_but_write_status(team: tuple[Kube, str], user: str) -> None:
    kubectl, namespace = team
    for verb in READ + WRITE:
        assert kubectl.can_i(user, verb, JOBS, "-n", namespace), f"{user} cannot {verb}"
    assert kubectl.can_i(user, "get", JOBS, "--subresource=status", "-n", namespace)
    assert not kubectl.can_i(user, "patch", JOBS, "--subresource=status", "-n", namespace)
    # Only where the role is bound.
    assert not kubectl.can_i(user, "create", JOBS, "-n", "default")


def test_view_may_only_read_finetunejobs(team: tuple[Kube, str]) -> None:
    kubectl, namespace = team
    for verb in READ:
        assert kubectl.can_i("bob", verb, JOBS, "-n", namespace), f"bob cannot {verb}"
    assert kubectl.can_i("bob", "watch", JOBS, "--subresource=status", "-n", namespace)
    for verb in WRITE:
        assert not kubectl.can_i("bob", verb, JOBS, "-n", namespace), f"bob may {verb}"


def _readme_cleanup_command() -> list[str]:
    readme = docs.all_text()
    (line,) = [x for x in readme.splitlines() if x.startswith("kubectl delete serviceaccount,role,rolebinding -A")]
    return line.split()[1:]


def test_the_readme_command_removes_the_trainer_identity_helm_leaves(team: tuple[Kube, str]) -> None:
    """What the operator makes on a namespace's first job (builders/rbac.py), removed by the
    README's command; scoped to this namespace here so other tests' identities stay."""
    kubectl, namespace = team
    kubectl.apply(rbac.identity(namespace))
    keep = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "team-own", "namespace": namespace}}
    kubectl.apply([keep])
    command = _readme_cleanup_command()
    at = command.index("-A")
    kubectl.run(*command[:at], "-n", namespace, *command[at + 1 :])
    left = kubectl.run("get", "serviceaccount,role,rolebinding", "-n", namespace, "-o", "name").stdout.split()
    assert not [name for name in left if name.endswith("/finetune-trainer")], left
    assert "serviceaccount/team-own" in left


def test_the_readme_gpu_quota_refuses_a_pod_beyond_it(team: tuple[Kube, str]) -> None:
    kubectl, namespace = team
    readme = docs.all_text()
    (line,) = [x.strip() for x in readme.splitlines() if x.strip().startswith("kubectl create quota gpus -n team-a")]
    kubectl.run(*[namespace if a == "team-a" else a for a in line.split()[1:]])

    def pod(gpus: int) -> dict[str, object]:
        limits = {"nvidia.com/gpu": str(gpus)}
        restricted = {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        container = {
            "name": "c",
            "image": "trainer",
            "resources": {"requests": limits, "limits": limits},
            "securityContext": restricted,
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"gpus-{gpus}"},
            "spec": {"containers": [container]},
        }

    # The quota controller fills in the quota's status before admission enforces it.
    deadline = time.monotonic() + 60
    while not kubectl.get("resourcequota", "gpus", "-n", namespace).get("status", {}).get("hard"):
        assert time.monotonic() < deadline, "the quota never got its status"
        time.sleep(1)
    kubectl.apply([pod(8)], "-n", namespace, "--dry-run=server")  # within it: admitted
    refused = kubectl.apply([pod(9)], "-n", namespace, "--dry-run=server", check=False)
    assert refused.returncode != 0 and "exceeded quota: gpus" in refused.stderr, refused.stderr


# What `ftjob upload` does with the user's own credentials (its pod is the user's, not the
# operator's child): make and remove its pod, and talk to it through the API server's pod proxy
# (GET is get, PUT update, POST create).
UPLOAD_RIGHTS = (
    ("create", "pods"),
    ("get", "pods"),
    ("delete", "pods"),
    *((v, "pods/proxy") for v in ("get", "update", "create")),
)


def test_edit_may_run_ftjob_upload_and_view_may_not(team: tuple[Kube, str]) -> None:
    kubectl, namespace = team
    for verb, resource in UPLOAD_RIGHTS:
        assert kubectl.can_i("alice", verb, resource, "-n", namespace), f"edit cannot {verb} {resource}"
        assert kubectl.can_i("carol", verb, resource, "-n", namespace), f"admin cannot {verb} {resource}"
    assert not kubectl.can_i("bob", "create", "pods", "-n", namespace)
    assert not kubectl.can_i("bob", "update", "pods/proxy", "-n", namespace)

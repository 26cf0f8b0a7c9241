"""`helm lint` and `helm template` of the chart, checked object by object.

Needs only the helm binary (the `helm_binary` fixture: the `tools` tier), no cluster: what the
API server thinks of these objects is in test_install.py. The checks of values.yaml alone read files.
"""

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api.constants import DEFAULT_IMAGE, LABEL_MANAGED_BY
from tests.support.helm import ALL_ON_VALUES, CHART, by_kind, env_of, helm, one, operator_rules, render, template_args

DEFAULT_KINDS = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Deployment",
    "Service",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "NetworkPolicy",
    # Leader election: its Role and RoleBinding on the Lease, and the replicas' disruption budget.
    "Role",
    "RoleBinding",
    "PodDisruptionBudget",
}
LEADER_SUFFIX = "-leader-election"


@pytest.mark.usefixtures("helm_binary")
@pytest.mark.parametrize("values", [[], [ALL_ON_VALUES]], ids=["defaults", "all-on"])
def test_lint_strict_is_clean(values: list[Path]) -> None:
    args = ["lint", "--strict", str(CHART)]
    for path in values:
        args += ["--values", str(path)]
    result = helm(*args, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


@pytest.mark.usefixtures("helm_binary")
def test_defaults_render_the_cluster_wide_operator_only() -> None:
    objects = render()
    assert {o["kind"] for o in objects} == DEFAULT_KINDS
    assert all(o["metadata"].get("namespace", "finetune-system") == "finetune-system" for o in objects)


@pytest.mark.usefixtures("helm_binary")
def test_all_on_renders_every_optional_part() -> None:
    objects = render([ALL_ON_VALUES])
    kinds = [o["kind"] for o in objects]
    # Namespaced mode binds nothing cluster-wide: its only ClusterRoles are the tenants' aggregated
    # ones, which grant nothing until a namespace binds view, edit or admin.
    assert "ClusterRoleBinding" not in kinds
    assert all(_is_tenant_role(o) for o in by_kind(objects, "ClusterRole"))
    for kind in ("Role", "RoleBinding"):
        found = sorted(o["metadata"]["namespace"] for o in by_kind(objects, kind) if not _is_leader_election(o))
        assert found == ["team-a", "team-b"], kind
    policies = sorted((o["metadata"]["namespace"], o["metadata"]["name"]) for o in by_kind(objects, "NetworkPolicy"))
    assert policies == [
        ("finetune-system", "ft-finetune-operator-operator"),
        ("finetune-system", "ft-finetune-operator-trainer-rules"),
    ]
    monitors = sorted(o["metadata"]["name"] for o in by_kind(objects, "ServiceMonitor"))
    assert monitors == ["ft-finetune-operator", "ft-finetune-operator-servers"], monitors
    servers = next(o for o in by_kind(objects, "ServiceMonitor") if o["metadata"]["name"].endswith("-servers"))
    # llama-server's metrics of the servers in the namespaces the operator watches.
    assert servers["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    assert servers["spec"]["selector"]["matchLabels"] == {
        "finetune.dev/component": "server",
        "app.kubernetes.io/managed-by": "finetune-operator",
    }
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"].endswith("@sha256:" + "0" * 64)
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    flavors = {o["metadata"]["name"]: o["spec"] for o in by_kind(objects, "ResourceFlavor")}
    assert flavors["tesla-p40"]["nodeLabels"] == {"example.com/gpu-model": "Tesla-P40"}
    assert "nodeTaints" not in flavors["a100"]
    queue = one(objects, "ClusterQueue")["spec"]
    assert queue["cohortName"] == "gpus"
    group = queue["resourceGroups"][0]
    assert group["coveredResources"] == ["cpu", "memory", "ephemeral-storage", "nvidia.com/gpu"]
    assert [f["name"] for f in group["flavors"]] == ["tesla-p40", "a100"]
    assert {"name": "nvidia.com/gpu", "nominalQuota": 16} in group["flavors"][0]["resources"]
    local = sorted((o["metadata"]["namespace"], o["spec"]["clusterQueue"]) for o in by_kind(objects, "LocalQueue"))
    assert local == [("team-a", "finetune-teams"), ("team-b", "finetune-teams")]
    assert [o["value"] for o in by_kind(objects, "WorkloadPriorityClass")] == [100, 1000]


@pytest.mark.usefixtures("helm_binary")
@pytest.mark.parametrize("values", [[], [ALL_ON_VALUES]], ids=["defaults", "all-on"])
def test_operator_deployment_is_replicated_probed_and_restricted(values: list[Path]) -> None:
    deployment = one(render(values), "Deployment")
    spec = deployment["spec"]
    # Two replicas, one leader: a rollout adds the new standby before it removes an old pod.
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "finetune_operator"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert set(ports) == {"health", "metrics"}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    # Pod Security `restricted`, field by field.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert all("hostPath" not in v for v in volumes.values())


def _is_leader_election(o: dict[str, Any]) -> bool:
    return o["kind"] in ("Role", "RoleBinding") and o["metadata"]["name"].endswith(LEADER_SUFFIX)


@pytest.mark.usefixtures("helm_binary")
@pytest.mark.parametrize("values", [[], [ALL_ON_VALUES]], ids=["defaults", "all-on"])
def test_replicas_spread_over_nodes_and_a_drain_keeps_one(values: list[Path]) -> None:
    objects = render(values)
    deployment = one(objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    affinity = deployment["spec"]["template"]["spec"]["affinity"]
    (preferred,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    term = preferred["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert all(pod_labels.get(k) == v for k, v in term["labelSelector"]["matchLabels"].items())
    if values:  # `affinity` of its own (a node preference) keeps it, with the spread added
        assert "nodeAffinity" in affinity
    budget = one(objects, "PodDisruptionBudget")["spec"]
    assert budget["minAvailable"] == 1
    assert all(pod_labels.get(k) == v for k, v in budget["selector"]["matchLabels"].items())

    hard = one(render(sets=["podAntiAffinity=hard"]), "Deployment")["spec"]["template"]["spec"]["affinity"]
    (required,) = hard["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["topologyKey"] == "kubernetes.io/hostname"


@pytest.mark.usefixtures("helm_binary")
def test_one_replica_without_leader_election_is_recreated_and_two_need_it() -> None:
    objects = render(sets=["replicaCount=1", "leaderElection.enabled=false"])
    spec = one(objects, "Deployment")["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    assert "affinity" not in spec["template"]["spec"]
    assert not by_kind(objects, "PodDisruptionBudget")
    assert not [o for o in objects if _is_leader_election(o)]
    assert env_of(one(objects, "Deployment"))["FINETUNE_LEADER_ELECTION"] == "false"
    # One replica with a leader: no budget (it would block every drain).
    assert not by_kind(render(sets=["replicaCount=1"]), "PodDisruptionBudget")
    result = helm(*template_args(sets=["leaderElection.enabled=false"]), check=False)
    assert result.returncode != 0 and "replicaCount: 2 replicas need leaderElection.enabled" in result.stderr


@pytest.mark.usefixtures("helm_binary")
@pytest.mark.parametrize("values", [[], [ALL_ON_VALUES]], ids=["cluster-mode", "namespaced-mode"])
def test_leader_election_is_one_lease_in_the_release_namespace(values: list[Path]) -> None:
    """The Role grants the Lease's rights (files/operator-leader-rbac.yaml, what the tests apply)
    in the release's namespace only, `get` and `update` on that one Lease; the operator reads the
    same Lease name and the chart's timings."""
    from finetune_operator import settings
    from tests.support.harness import leader_rules

    objects = render(values, sets=["leaderElection.leaseDuration=20", "leaderElection.renewDeadline=12"])
    sa = one(objects, "ServiceAccount")["metadata"]
    (role,) = [o for o in by_kind(objects, "Role") if _is_leader_election(o)]
    (binding,) = [o for o in by_kind(objects, "RoleBinding") if _is_leader_election(o)]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "finetune-system"
    lease = "ft-finetune-operator"
    assert role["rules"] == leader_rules(lease)
    assert all(r["resources"] == ["leases"] and r["apiGroups"] == ["coordination.k8s.io"] for r in role["rules"])
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}]
    env = env_of(one(objects, "Deployment"))
    parsed = settings.check(settings.from_env(env))
    assert parsed.leader_election and parsed.lease_name == lease and parsed.lease_namespace == "finetune-system"
    assert (parsed.lease_timings.lease_duration_s, parsed.lease_timings.renew_deadline_s) == (20, 12)
    assert parsed.lease_timings.retry_period_s == 2
    named = render(sets=["leaderElection.leaseName=fleet"])
    (role,) = [o for o in by_kind(named, "Role") if _is_leader_election(o)]
    assert role["rules"] == leader_rules("fleet")
    assert env_of(one(named, "Deployment"))["FINETUNE_LEASE_NAME"] == "fleet"


@pytest.mark.usefixtures("helm_binary")
def test_rendered_env_is_what_the_operator_reads() -> None:
    """The operator's own settings parser reads the rendered env: names and formats agree."""
    from finetune_operator import settings

    known = {row.env for row in settings.SETTINGS.values()}
    defaults = env_of(one(render(), "Deployment"))
    unknown = {name for name in defaults if name.startswith("FINETUNE_")} - known
    assert not unknown, f"the chart sets variables the operator does not read: {unknown}"

    parsed = settings.from_env(defaults)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert parsed.trainer_image == values["trainer"]["image"]
    assert parsed.clusterwide
    assert parsed.gpu_product_label == values["trainer"]["gpu"]["productLabelKey"]
    assert list(parsed.gpu_tolerations) == values["trainer"]["gpu"]["tolerations"]
    assert (parsed.default_cpu, parsed.default_memory) == ("4", "64Gi")
    assert parsed.metrics_port == values["metrics"]["port"]
    assert parsed.health_port == values["health"]["port"]
    assert parsed.trainer_uid == values["trainer"]["uid"]
    assert parsed.status_coalesce_seconds == values["statusCoalesceSeconds"]

    custom = settings.from_env(env_of(one(render([ALL_ON_VALUES]), "Deployment")))
    assert custom.namespaces == ("team-a", "team-b")
    assert custom.gpu_product_label == "example.com/gpu-model"
    assert custom.gpu_tolerations[0]["key"] == "dedicated"
    # The host memory a node offers per GPU reaches the planner by product; others keep its default.
    assert parsed.host_memory_per_gpu == {} and parsed.host_memory_for("Tesla-P40") is None
    assert custom.host_memory_for("Tesla-P40") == 48 * 2**30 and custom.host_memory_for("NVIDIA-H200") is None
    assert (custom.default_cpu, custom.default_memory) == ("8", "96Gi")
    assert (custom.log_level, custom.log_format, custom.image_pull_policy) == ("DEBUG", "text", "Always")
    assert (custom.tmp_size, custom.ephemeral_storage_request, custom.shm_memory_fraction) == ("20Gi", "2Gi", 0.25)
    assert (parsed.tmp_size, parsed.ephemeral_storage_request, parsed.shm_memory_fraction) == ("8Gi", "1Gi", 0.5)
    # Guardrails: off by default (0), each one reaching the operator when set.
    assert (parsed.max_gpus_per_job, parsed.max_nodes_per_job) == (None, None)
    assert (parsed.default_active_deadline_seconds, parsed.pending_timeout_seconds) == (None, None)
    assert (custom.max_gpus_per_job, custom.max_nodes_per_job) == (16, 4)
    assert (custom.default_active_deadline_seconds, custom.pending_timeout_seconds) == (259200, 3600)


def test_defaults_match_the_api_and_the_package() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (CHART.parents[1] / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M)
    assert version is not None
    assert chart["version"] == chart["appVersion"] == version.group(1)
    assert values["trainer"]["image"] == DEFAULT_IMAGE
    assert values["trainer"]["image"].endswith(":" + chart["appVersion"])


AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def _is_tenant_role(role: dict[str, Any]) -> bool:
    return any(key.startswith(AGGREGATE) for key in role["metadata"].get("labels", {}))


def _roles(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's own roles (the tenants' aggregated ClusterRoles are tested on their own)."""
    return [
        o
        for o in objects
        if o["kind"] in ("Role", "ClusterRole") and not _is_tenant_role(o) and not _is_leader_election(o)
    ]


def _tenant_grants(objects: list[dict[str, Any]]) -> dict[str, set[tuple[str, str]]]:
    """Built-in role (view, edit, admin) -> the (resource, verb) pairs the chart aggregates into it."""
    grants: dict[str, set[tuple[str, str]]] = {"view": set(), "edit": set(), "admin": set()}
    for role in filter(_is_tenant_role, by_kind(objects, "ClusterRole")):
        for label, value in role["metadata"]["labels"].items():
            if label.startswith(AGGREGATE) and value == "true":
                for rule in role["rules"]:
                    assert rule["apiGroups"] == ["finetune.dev"]
                    grants[label.removeprefix(AGGREGATE)] |= {(r, v) for r in rule["resources"] for v in rule["verbs"]}
    return grants


@pytest.mark.usefixtures("helm_binary")
@pytest.mark.parametrize("values", [[], [ALL_ON_VALUES]], ids=["cluster-mode", "namespaced-mode"])
def test_tenant_roles_aggregate_finetunejobs_into_view_edit_and_admin(values: list[Path]) -> None:
    grants = _tenant_grants(render(values))
    kinds = ("finetunejobs", "modelservers")
    read = {(r, v) for k in kinds for r in (k, f"{k}/status") for v in ("get", "list", "watch")}
    write = {(k, v) for k in kinds for v in ("create", "update", "patch", "delete", "deletecollection")}
    assert grants["view"] == read
    assert grants["edit"] == grants["admin"] == read | write
    # Status is the operator's and the trainer's: a tenant who could patch it could fake Succeeded
    # (or, for a server, the adapters a request's id picks).
    for kind in kinds:
        assert not {v for r, v in grants["admin"] if r == f"{kind}/status"} - {"get", "list", "watch"}


@pytest.mark.usefixtures("helm_binary")
def test_tenant_roles_can_be_left_out() -> None:
    objects = render(sets=["rbac.tenantRoles=false"])
    assert not [o for o in by_kind(objects, "ClusterRole") if _is_tenant_role(o)]
    assert _roles(objects)


def _strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [s for item in node for s in _strings(item)]
    if isinstance(node, dict):
        return [s for item in node.values() for s in _strings(item)]
    return []


@pytest.mark.usefixtures("helm_binary")
@pytest.mark.parametrize("values", [[], [ALL_ON_VALUES]], ids=["cluster-mode", "namespaced-mode"])
def test_rbac_has_no_wildcards_and_exactly_the_operators_rules(values: list[Path]) -> None:
    objects = render(values)
    roles = _roles(objects)
    assert roles
    rules = operator_rules()
    for role in roles:
        assert role["rules"] == rules, (
            f"{role['kind']} {role['metadata']['name']} drifted from files/operator-rbac.yaml"
        )
        assert not [s for s in _strings(role["rules"]) if "*" in s], "wildcard in RBAC"
    bindings = [o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding") and not _is_leader_election(o)]
    sa = one(objects, "ServiceAccount")["metadata"]["name"]
    assert len(bindings) == len(roles)
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": "finetune-system"}]


def test_operator_rules_cannot_read_secrets_or_touch_nodes() -> None:
    for rule in operator_rules():
        resources = set(rule.get("resources", []))
        verbs = set(rule.get("verbs", []))
        assert "*" not in verbs and "*" not in resources
        if "" in rule.get("apiGroups", []):
            assert not ({"secrets"} & resources and verbs & {"get", "list", "watch"}), rule
            assert not ({"nodes"} & resources and verbs - {"get", "list", "watch"}), rule


@pytest.mark.usefixtures("helm_binary")
def test_namespaced_mode_needs_namespaces_the_operator_may_write_in() -> None:
    """The release namespace is one the operator never writes in: namespaced mode names its own."""
    for sets in (["watch.mode=namespaced"], ["watch.mode=namespaced", "watch.namespaces={team-a,kube-system}"]):
        result = helm(*template_args(sets=sets), check=False)
        assert result.returncode != 0 and "watch.namespaces: " in result.stderr, result.stderr
        assert "goroutine" not in result.stderr
    objects = render(sets=["watch.mode=namespaced", "watch.namespaces={team-a}"])
    assert [r["metadata"]["namespace"] for r in _roles(objects)] == ["team-a"]
    assert env_of(one(objects, "Deployment"))["FINETUNE_NAMESPACES"] == "team-a"


@pytest.mark.usefixtures("helm_binary")
def test_excluded_namespaces_reach_the_operator_and_the_fence_from_one_value() -> None:
    from finetune_operator import settings

    objects = render(sets=["watch.excludedNamespaces={platform,vault}"])
    expected = ["kube-system", "kube-public", "kube-node-lease", "finetune-system", "platform", "vault"]
    parsed = settings.from_env(env_of(one(objects, "Deployment")))
    assert list(parsed.excluded_namespaces) == expected
    kinds = _named(objects, "ValidatingAdmissionPolicy", "-fence-kinds")
    (variable,) = [v for v in kinds["spec"]["variables"] if v["name"] == "excludedNamespaces"]
    assert json.loads(variable["expression"]) == expected


def _named(objects: list[dict[str, Any]], kind: str, suffix: str, namespace: str | None = None) -> dict[str, Any]:
    found = [
        o
        for o in by_kind(objects, kind)
        if o["metadata"]["name"].endswith(suffix) and namespace in (None, o["metadata"].get("namespace"))
    ]
    assert len(found) == 1, f"expected one {kind} named *{suffix}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def _trainer_network(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The trainers' network rules as the operator reads them (FINETUNE_TRAINER_NETWORK)."""
    raw = env_of(one(objects, "Deployment"))["FINETUNE_TRAINER_NETWORK"]
    parsed: dict[str, Any] = json.loads(raw) if raw else {}
    return parsed


def _fence_rules(objects: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fence's parameter for NetworkPolicies: the trainers' rules as a policy of no pod."""
    found = [o for o in by_kind(objects, "NetworkPolicy") if o["metadata"]["name"].endswith("-trainer-rules")]
    return found[0]["spec"] if found else None


@pytest.mark.usefixtures("helm_binary")
def test_no_static_trainer_policy_the_operator_makes_one_per_job() -> None:
    """The chart renders the operator's own NetworkPolicy and the fence's parameter (which selects
    no pod), nothing for trainers: each trainer's comes from the operator, per job, in whatever
    namespace the job runs (tests/operator/test_e2e_network.py)."""
    for values in ([], [ALL_ON_VALUES]):
        names = sorted(o["metadata"]["name"] for o in by_kind(render(values), "NetworkPolicy"))
        assert names == ["ft-finetune-operator-operator", "ft-finetune-operator-trainer-rules"]
        rules = _fence_rules(render(values))
        assert rules is not None and rules["podSelector"] == {"matchLabels": {"finetune.dev/trainer-rules": "template"}}


@pytest.mark.usefixtures("helm_binary")
def test_trainer_rules_reach_the_operator_and_the_fence_from_one_value() -> None:
    """One render of trainer.networkPolicy feeds both the operator's builder and the fence: the
    API server's addresses and ports, DNS, extraEgress (with the protocol the API server would
    default, so that the fence compares stored rules), the Hub rule, the multi-node ports."""
    from finetune_api import multinode

    objects = render([ALL_ON_VALUES])
    rules = _trainer_network(objects)
    api, dns, proxy = rules["egress"]
    assert api == {
        "to": [{"ipBlock": {"cidr": "10.0.0.10/32"}}],
        "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}],
    }
    assert dns["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ]
    assert {(p["protocol"], p["port"]) for p in dns["ports"]} == {("UDP", 53), ("TCP", 53)}
    assert proxy == {"to": [{"ipBlock": {"cidr": "10.0.0.20/32"}}], "ports": [{"protocol": "TCP", "port": 3128}]}
    assert rules["hubEgress"] == {
        "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "169.254.0.0/16"]}}],
        "ports": [{"protocol": "TCP", "port": 443}],
    }
    assert rules["peerPorts"] == [
        {"protocol": "TCP", "port": multinode.RDZV_PORT},
        {"protocol": "TCP", "port": 40000, "endPort": 50999},
    ]
    fence = _fence_rules(objects)
    assert fence is not None
    assert fence["egress"] == [*rules["egress"], rules["hubEgress"]]
    assert [r["ports"] for r in fence["ingress"]] == [rules["peerPorts"]]
    binding = _named(objects, "ValidatingAdmissionPolicyBinding", "-fence-networkpolicies")
    assert binding["spec"]["paramRef"] == {
        "name": "ft-finetune-operator-trainer-rules",
        "namespace": "finetune-system",
        "parameterNotFoundAction": "Allow",
    }
    # A port given without a protocol gets TCP, as the API server would store it.
    bare = [
        "trainer.networkPolicy.extraEgress[0].ports[0].port=8080",
        "trainer.networkPolicy.apiServerCIDRs={10.1.1.1/32}",
    ]
    assert _trainer_network(render(sets=bare))["egress"][2]["ports"] == [{"port": 8080, "protocol": "TCP"}]


@pytest.mark.usefixtures("helm_binary")
def test_network_policies_are_on_by_default_and_render_without_a_cluster_only_with_the_api_servers_address() -> None:
    """`helm template` cannot look the API server's addresses up: the chart refuses, in one line,
    rather than open the API server's ports on any address (which would reopen HTTPS to the
    private ranges the Hub rule leaves out); given them, the trainer reaches them and DNS only."""
    refused = helm(*template_args(offline=False), check=False)
    assert refused.returncode != 0 and "goroutine" not in refused.stderr
    assert "trainer.networkPolicy.apiServerCIDRs: the API server's addresses could not be looked up" in refused.stderr
    assert helm(*template_args(offline=False, sets=["trainer.networkPolicy.enabled=false"])).returncode == 0
    rules = _trainer_network(render())
    api, _dns = rules["egress"]
    assert api["to"] == [{"ipBlock": {"cidr": "10.96.0.1/32"}}]
    assert {p["port"] for p in api["ports"]} == {443, 6443}
    for egress in rules["egress"]:
        for peer in egress["to"]:
            # No peer that could be another namespace's pod: addresses of the API server, or kube-dns.
            assert "ipBlock" in peer or peer["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}, peer
    block = rules["hubEgress"]["to"][0]["ipBlock"]
    assert block["cidr"] == "0.0.0.0/0"
    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"} <= set(block["except"])


@pytest.mark.usefixtures("helm_binary")
def test_turned_off_the_operator_makes_no_policy_and_the_fence_admits_none() -> None:
    from finetune_operator.settings import from_env

    objects = render(sets=["trainer.networkPolicy.enabled=false"])
    assert _trainer_network(objects) == {}
    assert from_env(env_of(one(objects, "Deployment"))).trainer_network is None
    # The fence's parameter holds no rule: it admits no NetworkPolicy from the operator.
    rules = _fence_rules(objects)
    assert rules is not None and "egress" not in rules and "ingress" not in rules


@pytest.mark.usefixtures("helm_binary")
def test_the_tests_rules_are_the_charts() -> None:
    """tests/support/harness.py's TRAINER_NETWORK (what the tests' operator and fence use) is what
    the chart renders from its defaults for the local API server's address, and so is the fence's
    parameter."""
    from tests.support.harness import TRAINER_NETWORK, trainer_rules_policy

    objects = render(sets=["trainer.networkPolicy.apiServerCIDRs={127.0.0.1/32}"])
    assert _trainer_network(objects) == TRAINER_NETWORK
    assert _fence_rules(objects) == trainer_rules_policy()["spec"]


@pytest.mark.usefixtures("helm_binary")
def test_operator_pod_admits_only_its_ports_from_the_named_namespaces() -> None:
    objects = render(sets=["networkPolicy.ingressNamespaces={monitoring}"])
    deployment = one(objects, "Deployment")
    policy = _named(objects, "NetworkPolicy", "-operator")
    assert policy["metadata"]["namespace"] == "finetune-system"
    spec = policy["spec"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in spec["podSelector"]["matchLabels"].items())
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    (peer,) = rule["from"]
    assert peer == {
        "namespaceSelector": {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["finetune-system", "monitoring"]}
            ]
        }
    }
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert {p["port"] for p in rule["ports"]} == {p["containerPort"] for p in container["ports"]}
    off = render(sets=["networkPolicy.enabled=false", "rbac.operatorFencePolicy=false"])
    assert not by_kind(off, "NetworkPolicy")


@pytest.mark.usefixtures("helm_binary")
@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("logLevel=loud", "logLevel"),
        ("watch.mode=everywhere", "mode"),
        ("replicaCount=0", "replicaCount"),
        ("leaderElection.retryPeriod=0", "retryPeriod"),
        ("podAntiAffinity=always", "podAntiAffinity"),
        ("trainer.defaultResources.memory=lots", "memory"),
        ("metrics.port=70000", "port"),
        ("trainer.shmMemoryFraction=1.5", "shmMemoryFraction"),
        ("trainer.tmpSize=huge", "tmpSize"),
        ("trainer.allowedImages=null", "allowedImages"),
        ("trainer.allowedImages={reg.example.com/*/trainer}", "allowedImages"),
        ("trainer.hubEnv.LD_PRELOAD=/x.so", "hubEnv"),
        ("trainer.gpu.hostMemoryPerGpu.Tesla-P40=lots", "hostMemoryPerGpu"),
        ("watch.excludedNamespaces={Not_A_Name}", "excludedNamespaces"),
    ],
)
def test_schema_rejects_bad_values_naming_the_value(setting: str, named: str) -> None:
    result = helm(*template_args(sets=[setting]), check=False)
    assert result.returncode != 0, f"--set {setting} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert named in result.stderr


def _values_lines() -> list[str]:
    return (CHART / "values.yaml").read_text().splitlines()


def _doc_block(lines: list[str], index: int) -> list[str]:
    """The comment lines right above line `index`."""
    block = []
    j = index - 1
    while j >= 0 and lines[j].strip().startswith("#"):
        block.append(lines[j].strip())
        j -= 1
    return block


def test_every_value_is_documented() -> None:
    """helm-docs style: each value has a `# --` comment right above it. A documented mapping
    (e.g. `resources`) is one value; an undocumented one must document each of its keys."""
    lines = _values_lines()
    key = re.compile(r"^(\s*)([A-Za-z][A-Za-z0-9]*):(.*)$")
    stack: list[tuple[int, str]] = []
    undocumented: list[str] = []
    skip_below: int | None = None  # inside a list value or a documented mapping
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        if skip_below is not None and (indent > skip_below or stripped.startswith("- ")):
            continue
        skip_below = None
        match = key.match(line)
        assert match, f"values.yaml:{i + 1}: unexpected line {line!r}"
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [match.group(2)])
        documented = any(c.startswith("# --") for c in _doc_block(lines, i))
        rest = match.group(3).split("#")[0].strip()
        following = next((ln for ln in lines[i + 1 :] if ln.strip() and not ln.strip().startswith("#")), "")
        nested = not rest and len(following) - len(following.lstrip()) > indent
        if not rest and (following.strip().startswith("- ") or (nested and documented)):
            skip_below = indent
        elif nested:
            stack.append((indent, match.group(2)))
            continue  # an undocumented parent: its keys carry the docs
        if not documented:
            undocumented.append(f"values.yaml:{i + 1}: {path}")
    assert not undocumented, "values without a `# --` comment:\n" + "\n".join(undocumented)


def test_schema_knows_every_value() -> None:
    """values.schema.json rejects unknown keys, so every key of values.yaml must be in it."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        if isinstance(value, dict) and "properties" in node:
            for name, child in value.items():
                assert name in node["properties"], f"{path}{name} is missing from values.schema.json"
                walk(child, node["properties"][name], f"{path}{name}.")

    walk(values, schema, "")


@pytest.mark.usefixtures("helm_binary")
def test_template_is_deterministic() -> None:
    """Two renders are identical: no random names or generated secrets that churn on upgrade."""
    assert helm(*template_args()).stdout == helm(*template_args()).stdout


@pytest.mark.usefixtures("helm_binary")
def test_trainer_status_policy_is_the_files_rule_named_after_the_release() -> None:
    from tests.support.harness import trainer_status_policy

    objects = render()
    source = trainer_status_policy()
    for (source_policy, source_binding), suffix in zip(
        (source[0:2], source[2:4]), ("-trainer-status", "-trainer-status-pod"), strict=True
    ):
        policy = _named(objects, "ValidatingAdmissionPolicy", suffix)
        binding = _named(objects, "ValidatingAdmissionPolicyBinding", suffix)
        assert policy["spec"] == source_policy["spec"]
        assert binding["spec"] == {**source_binding["spec"], "policyName": policy["metadata"]["name"]}
        assert policy["metadata"]["labels"][LABEL_MANAGED_BY] == "Helm"
    off = render(sets=["rbac.trainerStatusPolicy=false", "rbac.operatorFencePolicy=false"])
    assert not by_kind(off, "ValidatingAdmissionPolicy") and not by_kind(off, "ValidatingAdmissionPolicyBinding")


@pytest.mark.usefixtures("helm_binary")
@pytest.mark.parametrize("values", [[], [ALL_ON_VALUES]], ids=["defaults", "all-on"])
def test_operator_fence_is_the_files_rules_for_this_release(values: list[Path]) -> None:
    """The chart's fence equals the file's policies (what the tests apply) with this release's
    operator user and allow-list filled in, each policy with its Deny binding."""
    from tests.support.harness import operator_fence_policies

    objects = render(values)
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    for path in values:
        chart_values["trainer"].update(yaml.safe_load(path.read_text()).get("trainer", {}))
    account = one(objects, "ServiceAccount")["metadata"]
    user = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    trainer = chart_values["trainer"]
    expected = operator_fence_policies(user, trainer["allowedImages"], trainer["hubEnv"])
    fence = [
        o for o in objects if o["kind"].startswith("ValidatingAdmissionPolicy") and "-fence-" in o["metadata"]["name"]
    ]
    policies = [o for o in fence if o["kind"] == "ValidatingAdmissionPolicy"]
    assert len(fence) == len(expected) and len(policies) == len(expected) // 2
    for source in expected:
        suffix = source["metadata"]["name"].removeprefix("finetune")
        rendered = _named(objects, source["kind"], suffix)
        assert rendered["metadata"]["labels"][LABEL_MANAGED_BY] == "Helm"
        if source["kind"] == "ValidatingAdmissionPolicy":
            assert rendered["spec"] == source["spec"], f"{suffix} drifted from files/operator-fence-policy.yaml"
        else:
            spec = {**source["spec"], "policyName": rendered["metadata"]["name"]}
            if "name" in spec.get("paramRef", {}):  # the release's trainer rules, in its namespace
                spec["paramRef"] = {**spec["paramRef"], "name": "ft-finetune-operator-trainer-rules"}
            assert rendered["spec"] == spec
    # The allow-list reaches both the policy and the operator, from the one value.
    jobs = _named(objects, "ValidatingAdmissionPolicy", "-fence-jobs")
    (images,) = [v for v in jobs["spec"]["variables"] if v["name"] == "allowedImages"]
    env = env_of(one(objects, "Deployment"))
    assert json.loads(images["expression"]) == json.loads(env["FINETUNE_ALLOWED_IMAGES"])
    # So do the Hub variables' values.
    (hub_env,) = [v for v in jobs["spec"]["variables"] if v["name"] == "hubEnv"]
    assert json.loads(hub_env["expression"]) == json.loads(env["FINETUNE_HUB_ENV"]) == trainer["hubEnv"]
    off = render(sets=["rbac.operatorFencePolicy=false"])
    assert not [o for o in off if "-fence-" in o["metadata"]["name"]]


@pytest.mark.usefixtures("helm_binary")
def test_the_default_trainer_image_is_allowed_and_a_wider_list_reaches_the_operator() -> None:
    from finetune_api import images
    from finetune_operator import settings

    parsed = settings.check(settings.from_env(env_of(one(render(), "Deployment"))))
    assert images.allowed(parsed.trainer_image, parsed.allowed_images)
    assert parsed.allowed_images == images.DEFAULT_ALLOWED_IMAGES
    wider = render(sets=["trainer.allowedImages={ghcr.io/finetune-operator/trainer,registry.example.com/ml/*}"])
    assert settings.from_env(env_of(one(wider, "Deployment"))).allowed_images == (
        "ghcr.io/finetune-operator/trainer",
        "registry.example.com/ml/*",
    )


@pytest.mark.usefixtures("helm_binary")
def test_a_default_trainer_image_outside_the_allow_list_fails_the_install_in_one_line() -> None:
    result = helm(*template_args(sets=["trainer.image=docker.io/evil/miner:latest"]), check=False)
    assert result.returncode != 0
    assert "trainer.image" in result.stderr and "trainer.allowedImages" in result.stderr
    assert "goroutine" not in result.stderr
    helm(
        *template_args(
            sets=["trainer.image=registry.example.com/ml/t:1", "trainer.allowedImages={registry.example.com/ml/*}"]
        )
    )

"""`helm lint` and `helm template` of the chart, checked object by object.

Needs only the helm binary, no cluster: what the API server thinks of these objects is in
test_install.py.
"""

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api.constants import DEFAULT_IMAGE, LABEL_COMPONENT, LABEL_MANAGED_BY, MANAGED_BY

from .helm import ALL_ON_VALUES, CHART, by_kind, env_of, helm, one, operator_rules, render, template_args

DEFAULT_KINDS = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Deployment",
    "Service",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


@pytest.mark.parametrize("values", [[], [ALL_ON_VALUES]], ids=["defaults", "all-on"])
def test_lint_strict_is_clean(values: list[Path]) -> None:
    args = ["lint", "--strict", str(CHART)]
    for path in values:
        args += ["--values", str(path)]
    result = helm(*args, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def test_defaults_render_the_cluster_wide_operator_only() -> None:
    objects = render()
    assert {o["kind"] for o in objects} == DEFAULT_KINDS
    assert all(o["metadata"].get("namespace", "finetune-system") == "finetune-system" for o in objects)


def test_all_on_renders_every_optional_part() -> None:
    objects = render([ALL_ON_VALUES])
    kinds = [o["kind"] for o in objects]
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds
    for kind in ("Role", "RoleBinding", "NetworkPolicy"):
        assert sorted(o["metadata"]["namespace"] for o in by_kind(objects, kind)) == ["team-a", "team-b"], kind
    one(objects, "ServiceMonitor")
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"].endswith("@sha256:" + "0" * 64)
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod["priorityClassName"] == "system-cluster-critical"


@pytest.mark.parametrize("values", [[], [ALL_ON_VALUES]], ids=["defaults", "all-on"])
def test_operator_deployment_is_single_recreated_probed_and_restricted(values: list[Path]) -> None:
    deployment = one(render(values), "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
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


def test_rendered_env_is_what_the_operator_reads() -> None:
    """The operator's own settings parser reads the rendered env: names and formats agree."""
    from finetune_operator import settings

    known = {v for k, v in vars(settings).items() if k.startswith("ENV_")}
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

    custom = settings.from_env(env_of(one(render([ALL_ON_VALUES]), "Deployment")))
    assert custom.namespaces == ("team-a", "team-b")
    assert custom.gpu_product_label == "example.com/gpu-model"
    assert custom.gpu_tolerations[0]["key"] == "dedicated"
    assert (custom.default_cpu, custom.default_memory) == ("8", "96Gi")
    assert (custom.log_level, custom.log_format, custom.image_pull_policy) == ("DEBUG", "text", "Always")


def test_defaults_match_the_api_and_the_package() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (CHART.parents[1] / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M)
    assert version is not None
    assert chart["version"] == chart["appVersion"] == version.group(1)
    assert values["trainer"]["image"] == DEFAULT_IMAGE
    assert values["trainer"]["image"].endswith(":" + chart["appVersion"])


def _roles(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in ("Role", "ClusterRole")]


def _strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [s for item in node for s in _strings(item)]
    if isinstance(node, dict):
        return [s for item in node.values() for s in _strings(item)]
    return []


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
    bindings = [o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
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


def test_namespaced_mode_defaults_to_the_release_namespace() -> None:
    objects = render(sets=["watch.mode=namespaced"])
    assert [r["metadata"]["namespace"] for r in by_kind(objects, "Role")] == ["finetune-system"]
    assert env_of(one(objects, "Deployment"))["FINETUNE_NAMESPACES"] == "finetune-system"


def test_network_policy_allows_only_the_api_server_and_dns() -> None:
    from finetune_operator.children import labels

    policy = by_kind(render([ALL_ON_VALUES]), "NetworkPolicy")[0]["spec"]
    selector = policy["podSelector"]["matchLabels"]
    trainer_labels = labels("any-job")
    assert selector == {LABEL_COMPONENT: trainer_labels[LABEL_COMPONENT], LABEL_MANAGED_BY: MANAGED_BY}
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"} and "ingress" not in policy
    api, dns, proxy = policy["egress"]
    assert api["to"] == [{"ipBlock": {"cidr": "10.0.0.10/32"}}]
    assert {p["port"] for p in api["ports"]} == {443, 6443}
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert {(p["protocol"], p["port"]) for p in dns["ports"]} == {("UDP", 53), ("TCP", 53)}
    assert proxy["ports"] == [{"protocol": "TCP", "port": 3128}]


def test_network_policy_without_api_addresses_fails_with_one_clear_line() -> None:
    result = helm(*template_args(sets=["trainer.networkPolicy.enabled=true"]), check=False)
    assert result.returncode != 0
    assert "trainer.networkPolicy.apiServerCIDRs" in result.stderr
    assert "goroutine" not in result.stderr


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("logLevel=loud", "logLevel"),
        ("watch.mode=everywhere", "mode"),
        ("replicas=2", "replicas"),
        ("trainer.defaultResources.memory=lots", "memory"),
        ("metrics.port=70000", "port"),
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


def test_template_is_deterministic() -> None:
    """Two renders are identical: no random names or generated secrets that churn on upgrade."""
    assert helm(*template_args()).stdout == helm(*template_args()).stdout


def test_trainer_status_policy_is_the_files_rule_named_after_the_release() -> None:
    from tests.operator.harness import trainer_status_policy

    objects = render()
    policy = one(objects, "ValidatingAdmissionPolicy")
    binding = one(objects, "ValidatingAdmissionPolicyBinding")
    source_policy, source_binding = trainer_status_policy()
    assert policy["spec"] == source_policy["spec"]
    assert policy["metadata"]["name"].endswith("-trainer-status")
    assert binding["spec"] == {**source_binding["spec"], "policyName": policy["metadata"]["name"]}
    assert policy["metadata"]["labels"][LABEL_MANAGED_BY] == "Helm"
    off = render(sets=["rbac.trainerStatusPolicy=false"])
    assert not by_kind(off, "ValidatingAdmissionPolicy") and not by_kind(off, "ValidatingAdmissionPolicyBinding")

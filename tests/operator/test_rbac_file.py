"""The operator's RBAC file (shared with the chart): no wildcards, no verbs it does not use,
and enough to grant each trainer its own Role (RBAC refuses to grant what one does not hold)."""

import dataclasses
import json
import re
from typing import Any

import yaml

from finetune_api.constants import GROUP, LABEL_JOB, MAX_NAME_LENGTH, PLURAL, TRAINER_SERVICE_ACCOUNT
from finetune_api.images import DEFAULT_ALLOWED_IMAGES
from finetune_operator.builders import job, rbac
from tests.support.harness import (
    FENCE_POLICY_FILE,
    OPERATOR_USER,
    operator_fence_policies,
    operator_rules,
    trainer_status_policy,
)
from tests.support.specs import OWNER, SETTINGS
from tests.support.specs import spec as spec_of

WRITES = {"create", "patch", "update", "delete", "deletecollection"}


def allowed(group: str, resource: str, verb: str) -> bool:
    return any(
        group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] and not r.get("resourceNames")
        for r in operator_rules()
    )


def test_no_wildcards_and_no_deletes():
    for rule in operator_rules():
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key], rule
        assert not {"delete", "deletecollection", "update", "escalate", "bind", "impersonate"} & set(rule["verbs"]), (
            rule
        )


def test_secrets_are_never_readable():
    assert not any("secrets" in r["resources"] for r in operator_rules())


def test_operator_holds_every_permission_it_grants_a_trainer():
    for rule in rbac.role("ns")["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert allowed(group, resource, verb), (group, resource, verb)


def test_children_it_creates_are_creatable():
    for group, resource in [
        ("", "serviceaccounts"),
        ("", "persistentvolumeclaims"),
        ("", "services"),
        ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("batch", "jobs"),
        ("networking.k8s.io", "networkpolicies"),
        ("", "events"),
    ]:
        assert allowed(group, resource, "create"), resource
    assert allowed("finetune.dev", "finetunejobs/status", "patch")
    assert not allowed("finetune.dev", "finetunejobs", "patch"), "the operator never writes the spec"
    for resource in ("finetunejobs", "jobs", "pods"):
        group = {"finetunejobs": "finetune.dev", "jobs": "batch", "pods": ""}[resource]
        assert all(allowed(group, resource, v) for v in ("get", "list", "watch")), resource


def test_kueue_workloads_are_only_read():
    """The status of a queued job comes from Kueue's Workload; the operator never writes one."""
    assert all(allowed("kueue.x-k8s.io", "workloads", v) for v in ("get", "list", "watch"))
    assert not any(allowed("kueue.x-k8s.io", "workloads", v) for v in WRITES)
    assert not any("kueue.x-k8s.io" in r["apiGroups"] and r["resources"] != ["workloads"] for r in operator_rules())


def test_the_trainer_status_policy_names_what_the_operator_builds():
    """The admission policy (a YAML file the chart renders) and the Python builders agree."""
    policy, binding, by_pod, by_pod_binding = trainer_status_policy()
    spec = policy["spec"]
    for each in (policy, by_pod):
        assert each["spec"]["matchConstraints"]["resourceRules"] == [
            {"apiGroups": [GROUP], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": [f"{PLURAL}/status"]}
        ]
        assert f"':{TRAINER_SERVICE_ACCOUNT}'" in each["spec"]["matchConditions"][0]["expression"]
    assert rbac.service_account("ns")["metadata"]["name"] == TRAINER_SERVICE_ACCOUNT
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}

    # The second policy's parameters are the namespace's name-checked trainer pods: those of a
    # job of several nodes and of a job of one node named "<name>-<index>", found by the labels
    # their pod templates carry, and no other job's (every status write evaluates the policy once
    # per parameter); the label it checks on the token's pod is the job label the builders set.
    def pod_labels(name: str, **overrides: Any) -> dict[str, str]:
        owner = dataclasses.replace(OWNER, name=name)
        built: dict[str, str] = job.job(owner, spec_of(**overrides), SETTINGS)["spec"]["template"]["metadata"]["labels"]
        return built

    assert by_pod["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "Pod"}
    param_ref = by_pod_binding["spec"]["paramRef"]
    selected = param_ref["selector"]["matchLabels"].items()
    two_nodes = {"gpus": 4, "nodes": 2, "gpuProduct": "Tesla-P40"}
    for name, overrides in (("gang", {"resources": two_nodes}), ("gang-1", {}), ("gang-0", {}), ("gang-99", {})):
        labels = pod_labels(name, **overrides)
        assert selected <= labels.items(), name
        assert labels[LABEL_JOB] == name
    for name in ("tiny", "gang-01", "gang-100", "run-0001", "gang-1a"):
        assert not selected <= pod_labels(name).items(), name
    assert f"'{LABEL_JOB}'" in {v["name"]: v["expression"] for v in by_pod["spec"]["variables"]}["paramJob"]
    assert by_pod_binding["spec"] == {
        "policyName": by_pod["metadata"]["name"],
        "paramRef": {**param_ref, "parameterNotFoundAction": "Allow"},
        "validationActions": ["Deny"],
    }
    # The policy reads the job from the pod's name "<job>-<5 characters>", or for a job of
    # several nodes "<job>-<index>-<5 characters>" (index < 64): the API server truncates a
    # generateName prefix past 58 characters, which neither form reaches.
    assert MAX_NAME_LENGTH + len("-63-") <= 58
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "object.metadata.name + '-'" in variables["tail"]
    assert "variables.nodes > 1" in variables["ofIndex"] and "< variables.nodes" in variables["ofIndex"]
    assert spec["validations"][0]["expression"].strip() == "size(variables.tail) == 5 || variables.ofIndex"


def _fence() -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in operator_fence_policies() if p["kind"] == "ValidatingAdmissionPolicy"}


def _variable(policy: dict[str, Any], name: str) -> Any:
    (found,) = [v["expression"] for v in policy["spec"].get("variables") or [] if v["name"] == name]
    return json.loads(found)


def test_the_fence_holds_the_trainer_role_the_builders_make():
    """The one trainer rule: the Role the operator creates is the Role the fence admits."""
    roles = _fence()["finetune-fence-roles"]
    (rule,) = rbac.role("ns")["rules"]
    assert rule == {
        "apiGroups": _variable(roles, "trainerApiGroups"),
        "resources": _variable(roles, "trainerResources"),
        "verbs": _variable(roles, "trainerVerbs"),
    }
    assert list(rbac.TRAINER_VERBS) == rule["verbs"]
    assert f"'{rbac.ROLE_NAME}'" in roles["spec"]["validations"][0]["expression"]


def test_the_fence_names_the_operators_identity_and_allow_list():
    for policy in _fence().values():
        (condition,) = policy["spec"]["matchConditions"]
        assert condition == {"name": "operator-only", "expression": f"request.userInfo.username == '{OPERATOR_USER}'"}
        assert policy["spec"]["failurePolicy"] == "Fail"
    assert tuple(_variable(_fence()["finetune-fence-jobs"], "allowedImages")) == DEFAULT_ALLOWED_IMAGES
    source = yaml.safe_load(FENCE_POLICY_FILE.read_text())
    (jobs,) = [p for p in source if p["metadata"]["name"] == "finetune-fence-jobs"]
    assert tuple(_variable(jobs, "allowedImages")) == DEFAULT_ALLOWED_IMAGES, "the file's default drifted"


def test_every_fence_rule_has_a_name_in_its_message():
    names = []
    for policy in _fence().values():
        for rule in policy["spec"]["validations"]:
            text = rule.get("message") or rule["messageExpression"]
            match = re.search(r"finetune-operator fence, rule ([a-z-]+):", text)
            assert match, f"{policy['metadata']['name']}: a rule without a name in its message: {text}"
            names.append(match.group(1))
            assert rule["reason"] in ("Invalid", "Forbidden")
    assert len(names) == len(set(names)), f"rule names repeat: {names}"
    for name in ("job-owner", "job-service-account", "job-privileged", "job-host-path", "job-image"):
        assert name in names
    assert f"'{TRAINER_SERVICE_ACCOUNT}'" in json.dumps(_fence()["finetune-fence-jobs"]["spec"])

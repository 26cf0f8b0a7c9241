"""The operator's RBAC file (shared with the chart): no wildcards, no verbs it does not use,
and enough to grant each trainer its own Role (RBAC refuses to grant what one does not hold)."""

from finetune_api.constants import GROUP, MAX_NAME_LENGTH, PLURAL, TRAINER_SERVICE_ACCOUNT
from finetune_operator.builders import rbac

from .harness import operator_rules, trainer_status_policy

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
        ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("batch", "jobs"),
        ("", "events"),
    ]:
        assert allowed(group, resource, "create"), resource
    assert allowed("finetune.dev", "finetunejobs/status", "patch")
    assert not allowed("finetune.dev", "finetunejobs", "patch"), "the operator never writes the spec"
    for resource in ("finetunejobs", "jobs", "pods"):
        group = {"finetunejobs": "finetune.dev", "jobs": "batch", "pods": ""}[resource]
        assert all(allowed(group, resource, v) for v in ("get", "list", "watch")), resource


def test_the_trainer_status_policy_names_what_the_operator_builds():
    """The admission policy (a YAML file the chart renders) and the Python builders agree."""
    policy, binding = trainer_status_policy()
    spec = policy["spec"]
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [GROUP], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": [f"{PLURAL}/status"]}
    ]
    assert f"':{TRAINER_SERVICE_ACCOUNT}'" in spec["matchConditions"][0]["expression"]
    assert rbac.service_account("ns")["metadata"]["name"] == TRAINER_SERVICE_ACCOUNT
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    # The policy reads the job from the pod's name "<job>-<5 characters>": the API server
    # truncates a generateName prefix past 58 characters, which job names never reach.
    assert MAX_NAME_LENGTH + 1 <= 58
    assert "size(object.metadata.name) + 6" in spec["validations"][0]["expression"]

"""The operator fence's rules for ModelServers hold exactly what their builders write
(builders/model_server.py): llama-server's command and flags, the environment's names, where
claims are mounted, the serving image allow-list, llama-server's port; and the Deployment's Pod
Security rules are the trainers' own, word for word but their names."""

import json
from typing import Any

import yaml

from finetune_api.images import DEFAULT_ALLOWED_SERVING_IMAGES
from finetune_api.served_files import CLAIMS_MOUNT, resolve
from finetune_api.server_spec import SERVER_PORT, ModelServerSpec
from finetune_operator.builders import model_server as builder
from finetune_operator.settings import Settings
from tests.support.harness import FENCE_POLICY_FILE
from tests.support.server_cases import job

# The Pod Security controls the trainers' Jobs and the servers' Deployments share.
POD_SECURITY = (
    "host-process",
    "host-namespaces",
    "proc-mount",
    "host-users",
    "privileged",
    "privilege-escalation",
    "capabilities",
    "non-root",
    "seccomp",
    "apparmor",
    "selinux",
    "sysctls",
)


def _policy(name: str) -> dict[str, Any]:
    (policy,) = [p for p in yaml.safe_load(FENCE_POLICY_FILE.read_text()) if p["metadata"]["name"] == name]
    return dict(policy)


def _literal(policy: dict[str, Any], name: str) -> Any:
    (found,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == name]
    return json.loads(found) if not found.startswith("'") else found.strip("'")


DEPLOYMENTS = _policy("finetune-fence-deployments")


def _deployments() -> list[dict[str, Any]]:
    """A server of each shape: adapters from jobs and a file, none, on the CPU."""
    jobs = {"a": job("a"), "b": job("b")}
    shapes = [
        {"base": {"job": "a"}, "adapters": [{"job": "a"}, {"job": "b"}, {"pvc": {"claimName": "m", "path": "x.gguf"}}]},
        {"base": {"pvc": {"claimName": "m", "path": "base.gguf"}}},
        {"base": {"job": "a"}, "resources": {"gpus": 0, "cpu": "500m"}},
    ]
    owner = builder.ServerOwner("chat", "team-a", "uid")
    out = []
    for shape in shapes:
        spec = ModelServerSpec.model_validate(shape)
        out.append(builder.deployment(owner, spec, resolve(spec, "team-a", jobs, None), Settings(default_cpu="2")))
    return out


def test_the_fence_pins_llama_servers_command_and_the_flags_the_builder_writes() -> None:
    assert _literal(DEPLOYMENTS, "serverCommand") == list(builder.COMMAND)
    flags = {a for d in _deployments() for a in d["spec"]["template"]["spec"]["containers"][0]["args"] if a[0] == "-"}
    assert flags == set(_literal(DEPLOYMENTS, "serverFlags")), "the fence admits exactly the flags the builder writes"


def test_the_fence_admits_the_environment_and_the_mounts_the_builder_writes() -> None:
    for made in _deployments():
        container = made["spec"]["template"]["spec"]["containers"][0]
        assert {e["name"] for e in container["env"]} <= set(_literal(DEPLOYMENTS, "envNames"))
        for mount in container["volumeMounts"]:
            assert mount["mountPath"] == _literal(DEPLOYMENTS, "tmpMount") or (
                mount["mountPath"].startswith(_literal(DEPLOYMENTS, "claimsMount")) and mount["readOnly"]
            )
    assert _literal(DEPLOYMENTS, "claimsMount") == CLAIMS_MOUNT + "/"
    assert _literal(DEPLOYMENTS, "tmpMount") == builder.TMP_MOUNT
    assert _literal(DEPLOYMENTS, "allowedServingImages") == list(DEFAULT_ALLOWED_SERVING_IMAGES)


def test_the_servers_network_policy_rule_holds_llama_servers_port() -> None:
    policy = _policy("finetune-fence-server-networkpolicies")
    assert json.loads(next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "serverPort")) == (
        SERVER_PORT
    )
    trainers = _policy("finetune-fence-networkpolicies")
    # Every policy is one fence's or the other's, by the server's label.
    assert trainers["spec"]["matchConstraints"]["objectSelector"] == {
        "matchExpressions": [{"key": "finetune.dev/server", "operator": "DoesNotExist"}]
    }
    assert policy["spec"]["matchConstraints"]["objectSelector"] == {
        "matchExpressions": [{"key": "finetune.dev/server", "operator": "Exists"}]
    }


def test_the_deployments_pod_security_rules_are_the_jobs_word_for_word() -> None:
    jobs = _policy("finetune-fence-jobs")

    def rules(policy: dict[str, Any], prefix: str) -> dict[str, str]:
        found = {}
        for validation in policy["spec"]["validations"]:
            said = str(validation.get("message") or validation.get("messageExpression"))
            for control in POD_SECURITY:
                if f"rule {prefix}-{control}:" in said:
                    found[control] = validation["expression"]
        return found

    assert rules(DEPLOYMENTS, "deployment") == rules(jobs, "job")
    assert len(rules(jobs, "job")) == len(POD_SECURITY)
    variables = {v["name"]: v["expression"] for v in jobs["spec"]["variables"]}
    for name in ("pod", "containers", "podContext", "templateAnnotations", "seLinuxTypes"):
        assert _literal_or_text(DEPLOYMENTS, name) == variables[name], name


def _literal_or_text(policy: dict[str, Any], name: str) -> str:
    (found,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == name]
    return str(found)

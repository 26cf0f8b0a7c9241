"""The trainers' NetworkPolicies, made by the real operator under the chart's RBAC and inside the
fence, on the control plane: the namespace's shared ones (every trainer pod; the Hub jobs' pods)
made before its first Job, in a namespace the chart never named (the test's fresh one), no job's
and kept when a job goes; two multi-node jobs of one namespace each get their own, owned by the
job and collected with it, opening their ports to their own pods alone.

The local cluster runs no network plugin, so no NetworkPolicy is enforced on traffic here: these
tests check the objects the API server stored (and the fence admitted). What a plugin enforces is
what these objects say. The jobs are suspended: no pod is needed to see the policies.
"""

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from finetune_api.constants import API_VERSION, KIND, LABEL_JOB
from tests.support.harness import TRAINER_NETWORK, Jobs, OperatorProcess, wait_for
from tests.support.specs import gpu_spec

pytestmark = pytest.mark.cluster

TWO_NODES = {"gpus": 4, "nodes": 2, "gpuProduct": "Tesla-P40", "cpu": "2", "memory": "8Gi"}


def _policy(jobs: Jobs, name: str) -> dict[str, Any] | None:
    try:
        found = client.NetworkingV1Api(jobs.api).read_namespaced_network_policy(name, jobs.namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    plain: dict[str, Any] = jobs.api.sanitize_for_serialization(found)
    return plain


def _job(jobs: Jobs, name: str) -> client.V1Job | None:
    try:
        return jobs.batch.read_namespaced_job(name, jobs.namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _policy_of(jobs: Jobs, name: str) -> dict[str, Any]:
    return wait_for(lambda: _policy(jobs, f"{name}-network"), 60, f"the NetworkPolicy of {name}")


def test_the_namespace_policies_fence_a_one_node_hub_job_before_its_job(jobs: Jobs, operator: OperatorProcess) -> None:
    """A one-node Hub job in a namespace no chart value lists: its pods are selected by the
    namespace's policy of every trainer (the chart's egress, no ingress) and by its Hub policy
    (HTTPS), both made before its Job, no job's, and kept when the job goes; the job has no
    policy of its own."""
    jobs.create("solo", {**gpu_spec(), "suspend": True})
    # The policies are written first, so the Job may not be there yet (a read at once once found
    # none, under load): wait for it, then hold the policies to it.
    found = wait_for(lambda: _job(jobs, "solo"), 60, "the Job of solo")
    job = jobs.api.sanitize_for_serialization(found)
    template = job["spec"]["template"]["metadata"]["labels"]
    egress = {
        "finetune-trainers": TRAINER_NETWORK["egress"],
        "finetune-trainers-hub": [TRAINER_NETWORK["hubEgress"]],
    }
    for name, rules in egress.items():
        policy = _policy(jobs, name)
        assert policy is not None, name
        assert not policy["metadata"].get("ownerReferences") and LABEL_JOB not in policy["metadata"]["labels"]
        spec = policy["spec"]
        assert spec["podSelector"]["matchLabels"].items() <= template.items(), (name, template)
        assert set(spec["policyTypes"]) == {"Ingress", "Egress"} and not spec.get("ingress")
        assert spec["egress"] == rules
        # Made before the Job: its pods never run without them.
        assert job["metadata"]["creationTimestamp"] >= policy["metadata"]["creationTimestamp"]
    assert _policy(jobs, "solo-network") is None
    jobs.delete("solo")
    wait_for(lambda: jobs.get("solo") is None or None, 60, "solo deleted")
    assert _policy(jobs, "finetune-trainers") is not None


def test_two_multinode_jobs_of_a_namespace_do_not_open_ports_to_each_other(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    for name in ("left", "right"):
        jobs.create(name, {**gpu_spec(), "resources": TWO_NODES, "suspend": True})
    policies = {name: _policy_of(jobs, name)["spec"] for name in ("left", "right")}
    for name, spec in policies.items():
        own = [{"podSelector": {"matchLabels": {LABEL_JOB: name}}}]
        assert spec["podSelector"]["matchLabels"][LABEL_JOB] == name
        # In: only the job's own pods, only on the rendezvous and collective ports.
        (ingress,) = spec["ingress"]
        assert ingress["from"] == own and ingress["ports"] == TRAINER_NETWORK["peerPorts"]
        # Out: the same ports to its own pods alone (the chart's rules and the Hub's are the
        # namespace's policies').
        peers = [rule for rule in spec["egress"] if any("podSelector" in p and len(p) == 1 for p in rule["to"])]
        assert peers == [{"to": own, "ports": TRAINER_NETWORK["peerPorts"]}]
    other = {"left": "right", "right": "left"}
    for name, spec in policies.items():
        selected = [
            p["podSelector"]["matchLabels"].get(LABEL_JOB)
            for rule in spec["ingress"] + spec["egress"]
            for p in rule.get("from", rule.get("to", []))
            if "podSelector" in p and len(p) == 1
        ]
        assert other[name] not in selected and set(selected) == {name}
    # Each is its job's, and goes with it.
    owner = jobs.get("left")
    assert owner is not None
    (reference,) = _policy_of(jobs, "left")["metadata"]["ownerReferences"]
    assert reference["apiVersion"] == API_VERSION and reference["kind"] == KIND
    assert reference["uid"] == owner["metadata"]["uid"] and reference["controller"] is True
    jobs.delete("left")
    wait_for(lambda: _policy(jobs, "left-network") is None or None, 60, "the policy collected with its job")


def _grpo_spec(url: str) -> dict[str, Any]:
    """A suspended GRPO job (Hub sources: no input check) whose one reward calls `url`."""
    rewards = [{"name": "judge", "http": {"url": url}}]
    spec = gpu_spec(training={"method": "grpo", "grpo": {"maxCompletionLength": 16, "rewards": rewards}}, suspend=True)
    spec["dataset"]["format"] = "prompt"
    return spec


def test_a_grpo_job_waits_for_its_reward_service_then_reaches_its_pods_alone(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    """The job waits, Pending with ServiceMissing and one Warning, while the Service its http
    reward calls is missing; once it exists, the job's own `<job>-rewards` (owned by it, before
    its Job) lets its pods reach the Service's pods on the Service's target port, and no others."""
    jobs.create("grpo", _grpo_spec("http://judge:8080/score"))
    waiting = jobs.status_when(
        "grpo", lambda s: str(s.get("message", "")).startswith("waiting for Service"), "waiting for its Service", 60
    )
    assert waiting["phase"] == "Pending"
    assert (
        waiting["message"]
        == "waiting for Service 'judge' (spec.training.grpo.rewards[0].http.url): the namespace has none"
    )
    assert jobs.condition("grpo", "Running")["reason"] == "ServiceMissing"
    said = [e["message"] for e in jobs.events_with("grpo", "ServiceMissing") if e["reason"] == "ServiceMissing"]
    assert said == [waiting["message"]]
    assert _job(jobs, "grpo") is None and _policy(jobs, "grpo-rewards") is None
    judge = {"selector": {"app": "judge"}, "ports": [{"name": "http", "port": 8080, "targetPort": 9000}]}
    jobs.core.create_namespaced_service(jobs.namespace, {"metadata": {"name": "judge"}, "spec": judge})
    # The resync (5 s here) looks again.
    found = wait_for(lambda: _job(jobs, "grpo"), 60, "the Job of grpo once its Service exists")
    policy = _policy(jobs, "grpo-rewards")
    assert policy is not None
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"][LABEL_JOB] == "grpo" and not spec.get("ingress")
    assert spec["egress"] == [
        {"to": [{"podSelector": {"matchLabels": {"app": "judge"}}}], "ports": [{"protocol": "TCP", "port": 9000}]}
    ]
    (reference,) = policy["metadata"]["ownerReferences"]
    assert reference["kind"] == KIND and reference["name"] == "grpo" and reference["controller"] is True
    job = jobs.api.sanitize_for_serialization(found)
    assert job["metadata"]["creationTimestamp"] >= policy["metadata"]["creationTimestamp"]


def test_a_grpo_job_calling_another_namespaces_service_fails_naming_the_field(
    jobs: Jobs, operator: OperatorProcess
) -> None:
    jobs.create("elsewhere", _grpo_spec("http://judge.other-team:8080/score"))
    failed = jobs.wait_phase("elsewhere", "Failed", 60)
    assert failed["message"] == (
        f"spec.training.grpo.rewards[0].http.url: a reward service must be in the job's namespace ({jobs.namespace}), "
        "not other-team"
    )
    assert jobs.condition("elsewhere", "Failed")["reason"] == "Invalid"
    assert _job(jobs, "elsewhere") is None and _policy(jobs, "elsewhere-rewards") is None

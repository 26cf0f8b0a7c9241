"""Each job's NetworkPolicy, made by the real operator under the chart's RBAC and inside the fence,
on the control plane: every job gets its own, in a namespace the chart never named (the test's
fresh one), owned by the FineTuneJob and collected with it; two multi-node jobs of one namespace
each open their ports to their own pods alone.

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
        found = client.NetworkingV1Api(jobs.api).read_namespaced_network_policy(f"{name}-network", jobs.namespace)
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
    return wait_for(lambda: _policy(jobs, name), 60, f"the NetworkPolicy of {name}")


def test_every_job_gets_its_own_policy_owned_by_it(jobs: Jobs, operator: OperatorProcess) -> None:
    """A one-node Hub job in a namespace no chart value lists: the chart's egress plus HTTPS, no
    ingress, its own pods selected; the policy goes when the FineTuneJob goes."""
    jobs.create("solo", {**gpu_spec(), "suspend": True})
    policy = _policy_of(jobs, "solo")
    owner = jobs.get("solo")
    assert owner is not None
    (reference,) = policy["metadata"]["ownerReferences"]
    assert reference["apiVersion"] == API_VERSION and reference["kind"] == KIND
    assert reference["uid"] == owner["metadata"]["uid"] and reference["controller"] is True
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"][LABEL_JOB] == "solo"
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"} and not spec.get("ingress")
    assert spec["egress"] == [*TRAINER_NETWORK["egress"], TRAINER_NETWORK["hubEgress"]]
    # The Job came after its policy: its pods never run without it. The policy is written first,
    # so the Job may not be there yet when the policy is (a read at once once found none, under load).
    found = wait_for(lambda: _job(jobs, "solo"), 60, "the Job after its policy")
    job = jobs.api.sanitize_for_serialization(found)
    assert job["metadata"]["creationTimestamp"] >= policy["metadata"]["creationTimestamp"]
    jobs.delete("solo")
    wait_for(lambda: _policy(jobs, "solo") is None or None, 60, "the policy collected with its job")


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
        # Out: the chart's rules, the Hub's, and the same ports to its own pods alone.
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

"""The NetworkPolicy of one job (builders/network.py), pure: it selects the job's own pods, copies
the chart's rules unchanged, adds the Hub's rule to Hub jobs alone, and opens the multi-node ports
to the job's own pods alone. The fence's side is in tests/security/test_fence.py, the chart's in
tests/chart/test_render.py, the operator making them in tests/operator/test_e2e_network.py."""

import dataclasses
import json

import pytest

from finetune_api.constants import LABEL_JOB
from finetune_api.spec import FineTuneJobSpec
from finetune_operator.builders import network
from finetune_operator.children import Owner, labels
from finetune_operator.decide import desired_children
from finetune_operator.settings import ENV_TRAINER_NETWORK, SettingsError, TrainerNetwork, from_env
from tests.support.harness import TRAINER_NETWORK
from tests.support.specs import OWNER, SETTINGS, gpu_spec, spec

RULES = from_env({ENV_TRAINER_NETWORK: json.dumps(TRAINER_NETWORK)}).trainer_network
TWO_NODES = {"resources": {"gpus": 0, "cpu": "1", "memory": "2Gi", "nodes": 2}}


def _rules() -> TrainerNetwork:
    assert RULES is not None
    return RULES


def test_a_one_node_job_gets_the_charts_egress_and_no_ingress() -> None:
    policy = network.network_policy(OWNER, spec(), _rules())
    meta = policy["metadata"]
    assert meta["name"] == "tiny-network" and meta["namespace"] == OWNER.namespace
    assert meta["ownerReferences"] == [OWNER.reference()]
    assert meta["labels"][LABEL_JOB] == OWNER.name
    body = policy["spec"]
    assert body["podSelector"] == {"matchLabels": labels(OWNER.name)}
    assert body["policyTypes"] == ["Ingress", "Egress"] and body["ingress"] == []
    assert body["egress"] == TRAINER_NETWORK["egress"]


def test_only_a_hub_job_gets_https_egress() -> None:
    from_hub = FineTuneJobSpec.model_validate(gpu_spec())
    hub = network.network_policy(OWNER, from_hub, _rules())["spec"]["egress"]
    assert hub == [*TRAINER_NETWORK["egress"], TRAINER_NETWORK["hubEgress"]]
    off = dataclasses.replace(_rules(), hub_egress=None)
    assert network.network_policy(OWNER, from_hub, off)["spec"]["egress"] == TRAINER_NETWORK["egress"]


def test_two_multinode_jobs_of_a_namespace_open_their_ports_to_their_own_pods_alone() -> None:
    policies = {
        name: network.network_policy(Owner(name, "team-a", f"uid-{name}"), spec(**TWO_NODES), _rules())["spec"]
        for name in ("left", "right")
    }
    for name, body in policies.items():
        own = [{"podSelector": {"matchLabels": {LABEL_JOB: name}}}]
        (ingress,) = body["ingress"]
        assert ingress == {"from": own, "ports": TRAINER_NETWORK["peerPorts"]}
        *charts, peers = body["egress"]
        assert charts == TRAINER_NETWORK["egress"]
        assert peers == {"to": own, "ports": TRAINER_NETWORK["peerPorts"]}
        assert body["podSelector"]["matchLabels"][LABEL_JOB] == name
    # Neither job's policy names the other's pods, in either direction.
    left, right = policies["left"], policies["right"]
    assert "right" not in json.dumps(left) and "left" not in json.dumps(right)


def test_the_policy_is_made_before_the_job_and_only_when_on() -> None:
    on = dataclasses.replace(SETTINGS, trainer_network=_rules())
    kinds = [c["kind"] for c in desired_children(OWNER, spec(**TWO_NODES), on)]
    assert kinds == ["NetworkPolicy", "Service", "Job"]
    assert [c["kind"] for c in desired_children(OWNER, spec(), SETTINGS)] == ["Job"]


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ("{", "FINETUNE_TRAINER_NETWORK: not JSON"),
        ("[]", "FINETUNE_TRAINER_NETWORK: expected a JSON object"),
        ('{"egress": []}', "FINETUNE_TRAINER_NETWORK: egress is empty"),
        ('{"egress": [1]}', "FINETUNE_TRAINER_NETWORK: egress must be a JSON list of objects"),
        ('{"egress": [{}], "hubEgress": 1}', "FINETUNE_TRAINER_NETWORK: hubEgress must be"),
    ],
)
def test_bad_rules_stop_the_operator_in_one_line(raw: str, error: str) -> None:
    with pytest.raises(SettingsError, match=error):
        from_env({ENV_TRAINER_NETWORK: raw})


def test_empty_rules_mean_no_policies() -> None:
    assert from_env({ENV_TRAINER_NETWORK: ""}).trainer_network is None

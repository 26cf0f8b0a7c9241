"""The trainers' NetworkPolicies (builders/network.py), pure: the namespace's shared one selects
every trainer pod and copies the chart's rules unchanged, the shared Hub one adds the Hub's rule
to Hub jobs' pods alone, and a multi-node job's own opens its ports to its own pods alone; what
each pod is allowed, all policies selecting it added up, is what the one policy per job allowed
before. The fence's side is in tests/security/test_fence.py, the chart's in
tests/chart/test_render.py, the operator making them in tests/operator/test_e2e_network.py."""

import dataclasses
import json
import re
from typing import Any

import pytest
import yaml

from finetune_api.constants import LABEL_JOB
from finetune_api.spec import FineTuneJobSpec
from finetune_operator.builders import multinode, network
from finetune_operator.builders import preflight as preflight_builder
from finetune_operator.children import Owner, labels
from finetune_operator.decide import desired_children, namespace_children
from finetune_operator.setting_parsers import SettingsError, TrainerNetwork
from finetune_operator.settings import SETTINGS as TABLE
from finetune_operator.settings import from_env
from tests.support.harness import FENCE_POLICY_FILE, TRAINER_NETWORK
from tests.support.specs import OWNER, SETTINGS, gpu_spec, spec

ENV_TRAINER_NETWORK = TABLE["trainer_network"].env
RULES = from_env({ENV_TRAINER_NETWORK: json.dumps(TRAINER_NETWORK)}).trainer_network
TWO_NODES = {"resources": {"gpus": 0, "cpu": "1", "memory": "2Gi", "nodes": 2}}


def _rules() -> TrainerNetwork:
    assert RULES is not None
    return RULES


def _selects(policy: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    selector = policy["spec"]["podSelector"]
    assert set(selector) == {"matchLabels"}, selector  # the builders use labels only
    return bool(selector["matchLabels"].items() <= pod_labels.items())


def allowed(owner: Owner, shape: FineTuneJobSpec, pod_labels: dict[str, str], rules: TrainerNetwork) -> dict[str, Any]:
    """What a pod with these labels, of this job, may do under every policy of its namespace that
    selects it (NetworkPolicies add up), beside two multi-node jobs: isolated each way by any
    selecting policy of that type, and allowed the union of their rules."""
    neighbours = [Owner(name, owner.namespace, f"uid-{name}") for name in ("left", "right") if name != owner.name]
    found = [
        network.job_policy(owner, shape, rules),
        *(network.job_policy(o, spec(**TWO_NODES), rules) for o in neighbours),
    ]
    policies = [*network.namespace_policies(owner.namespace, rules), *(p for p in found if p is not None)]
    selecting = [p for p in policies if _selects(p, pod_labels)]
    egress: list[Any] = []
    ingress: list[Any] = []
    for policy in selecting:
        egress += [r for r in policy["spec"]["egress"] if r not in egress]
        ingress += [r for r in policy["spec"]["ingress"] if r not in ingress]
    types = {t for p in selecting for t in p["spec"]["policyTypes"]}
    return {"types": types, "egress": egress, "ingress": ingress}


def _pod_labels(owner: Owner, shape: FineTuneJobSpec) -> dict[str, str]:
    template: dict[str, str] = multinode.indexed_job(owner, shape, SETTINGS)["spec"]["template"]["metadata"]["labels"]
    return template


def test_a_one_node_pod_gets_the_charts_egress_and_no_ingress() -> None:
    said = allowed(OWNER, spec(), _pod_labels(OWNER, spec()), _rules())
    assert said == {"types": {"Ingress", "Egress"}, "egress": TRAINER_NETWORK["egress"], "ingress": []}


def test_only_a_hub_jobs_pods_get_https_egress() -> None:
    from_hub = FineTuneJobSpec.model_validate(gpu_spec())
    hub = allowed(OWNER, from_hub, _pod_labels(OWNER, from_hub), _rules())
    assert hub["egress"] == [*TRAINER_NETWORK["egress"], TRAINER_NETWORK["hubEgress"]] and hub["ingress"] == []
    off = dataclasses.replace(_rules(), hub_egress=None)
    assert [p["metadata"]["name"] for p in network.namespace_policies(OWNER.namespace, off)] == [network.TRAINERS]
    assert allowed(OWNER, from_hub, _pod_labels(OWNER, from_hub), off)["egress"] == TRAINER_NETWORK["egress"]
    # The input check of a Hub job needs no network: it is under the chart's rules alone.
    check = preflight_builder.preflight_job(OWNER, from_hub, SETTINGS)["spec"]["template"]["metadata"]["labels"]
    assert allowed(OWNER, from_hub, check, _rules())["egress"] == TRAINER_NETWORK["egress"]


def test_the_shared_policies_are_no_jobs_and_select_trainer_pods_alone() -> None:
    for policy in network.namespace_policies("team-a", _rules()):
        meta = policy["metadata"]
        assert meta["namespace"] == "team-a" and "ownerReferences" not in meta
        assert LABEL_JOB not in meta["labels"]
        assert policy["spec"]["ingress"] == [] and set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    # The operator's own children that are no pods (its identity) carry the labels too, but
    # only pods are selected; a pod without the trainer component is not.
    assert not _selects(network.namespace_policies("team-a", _rules())[0], {"app": "web"})


def test_two_multinode_jobs_of_a_namespace_open_their_ports_to_their_own_pods_alone() -> None:
    shape = spec(**TWO_NODES)
    for name, other in (("left", "right"), ("right", "left")):
        owner = Owner(name, "team-a", f"uid-{name}")
        own = [{"podSelector": {"matchLabels": {LABEL_JOB: name}}}]
        said = allowed(owner, shape, _pod_labels(owner, shape), _rules())
        assert said["ingress"] == [{"from": own, "ports": TRAINER_NETWORK["peerPorts"]}]
        *charts, peers = said["egress"]
        assert charts == TRAINER_NETWORK["egress"]
        assert peers == {"to": own, "ports": TRAINER_NETWORK["peerPorts"]}
        body = network.job_policy(owner, shape, _rules())
        assert body is not None and body["metadata"]["ownerReferences"] == [owner.reference()]
        assert body["spec"]["podSelector"] == {"matchLabels": labels(name)}
        # Neither job's policy names the other's pods, in either direction.
        assert other not in json.dumps(body)
    assert network.job_policy(OWNER, spec(), _rules()) is None


def test_the_namespace_policies_come_with_its_identity_and_a_jobs_own_before_its_job() -> None:
    on = dataclasses.replace(SETTINGS, trainer_network=_rules())
    kinds = [c["kind"] for c in desired_children(OWNER, spec(**TWO_NODES), on)]
    assert kinds == ["NetworkPolicy", "Service", "Job"]
    assert [c["kind"] for c in desired_children(OWNER, spec(), on)] == ["Job"]
    assert [c["kind"] for c in desired_children(OWNER, spec(), SETTINGS)] == ["Job"]
    shared = [(c["kind"], c["metadata"]["name"]) for c in namespace_children("team-a", on)]
    assert shared[-2:] == [("NetworkPolicy", network.TRAINERS), ("NetworkPolicy", network.HUB_TRAINERS)]
    assert all(c["kind"] != "NetworkPolicy" for c in namespace_children("team-a", SETTINGS))


def test_the_fence_names_the_shared_policies_and_their_labels_as_the_builder_does() -> None:
    (fence,) = [
        p
        for p in yaml.safe_load(FENCE_POLICY_FILE.read_text())
        if p["metadata"]["name"] == "finetune-fence-networkpolicies"
    ]
    variables = {v["name"]: v["expression"] for v in fence["spec"]["variables"]}
    shared = [network.TRAINERS, network.HUB_TRAINERS, network.OBJECT_TRAINERS]
    assert re.findall(r"'([^']+)'", variables["shared"]) == shared
    said_pods = re.findall(r"\{([^}]*)\}", variables["sharedPods"])
    store = {"to": [{"ipBlock": {"cidr": "10.0.5.10/32"}}], "ports": [{"protocol": "TCP", "port": 9000}]}
    rules = dataclasses.replace(_rules(), object_egress=(store,))
    for said, policy in zip(said_pods, network.namespace_policies("x", rules), strict=True):
        pairs = dict(re.findall(r"'([^']+)': '([^']+)'", said))
        assert pairs == policy["spec"]["podSelector"]["matchLabels"]


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

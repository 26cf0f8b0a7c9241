"""The NetworkPolicy of one job: what its trainer pods may reach, and what may reach them.

One policy per job, owned by it (collected with it), made before its Job so that no trainer pod
runs without it, in whatever namespace the job is. It selects the job's own pods
(`finetune.dev/job`), and:
- egress: the chart's rules for every trainer (`Settings.trainer_network.egress`: the API
  server, DNS, `extraEgress`), copied unchanged, plus the Hub's HTTPS rule for a job that
  downloads from the Hub;
- ingress: none for a job of one pod; for a job of several nodes, its own pods alone, on the
  rendezvous and collective ports, both ways. Another job's pods, multi-node or not, stay out.

The fence (operator-fence-policy.yaml, `finetune-fence-networkpolicies`) admits exactly this
shape from the operator: the chart's rules and a peer rule naming the job's own pods.
"""

from typing import Any, Final

from finetune_api.constants import LABEL_JOB
from finetune_api.contract import uses_hub
from finetune_api.spec import FineTuneJobSpec

from ..children import Owner, labels, metadata
from ..settings import TrainerNetwork

SUFFIX: Final = "-network"


def policy_name(job: str) -> str:
    # Job names are at most 52 characters: the name stays within 63.
    return job + SUFFIX


def peers(owner: Owner) -> list[dict[str, Any]]:
    """The job's own pods, in its own namespace (no namespaceSelector: this namespace only)."""
    return [{"podSelector": {"matchLabels": {LABEL_JOB: owner.name}}}]


def network_policy(owner: Owner, spec: FineTuneJobSpec, rules: TrainerNetwork) -> dict[str, Any]:
    egress = [dict(rule) for rule in rules.egress]
    if rules.hub_egress is not None and uses_hub(spec):
        egress.append(dict(rules.hub_egress))
    ingress: list[dict[str, Any]] = []
    if spec.resources.multinode:
        ports = [dict(port) for port in rules.peer_ports]
        egress.append({"to": peers(owner), "ports": ports})
        ingress.append({"from": peers(owner), "ports": [dict(port) for port in ports]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(owner, policy_name(owner.name)),
        "spec": {
            "podSelector": {"matchLabels": labels(owner.name)},
            # Both types always: with no ingress rule, nothing reaches a trainer of one pod.
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": egress,
        },
    }

"""The NetworkPolicies of trainer pods: what they may reach, and what may reach them.

Two the namespace's jobs share, and one more per job of several nodes:
- `finetune-trainers` selects every trainer pod of the namespace (the trainer component label,
  managed by the operator: the Job's pods and the input check's): egress, the chart's rules for
  every trainer (`Settings.trainer_network.egress`: the API server, DNS, `extraEgress`), copied
  unchanged; ingress, none.
- `finetune-trainers-hub` selects only the pods of jobs that download from the Hub (the Job
  builder labels them `finetune.dev/hub-egress`), and adds the Hub's HTTPS rule.
- `finetune-trainers-objects` selects only the pods that reach an S3-compatible store (the
  pre-flight and fetch of a job with an s3 source, the trainer of a job with output.s3: labelled
  `finetune.dev/object-egress`), and adds the chart's rules to the stores (`objectStorage`).
- a job of several nodes gets `<job>-network`, owned by it: its own pods alone, on the
  rendezvous and collective ports, both ways. Another job's pods, multi-node or not, stay out.
- a job whose trainer calls Services of its namespace (GRPO's http rewards: the objective's
  `services`) gets `<job>-rewards`, owned by it: egress from its own pods to the pods each
  Service selects, on the Service's target port for the port its URL names, and nothing else.
  A policy selects pods, not Services, so the operator reads each Service first (`service_egress`);
  a job whose Service is missing waits, saying so, and its Job is made once the Service is there.
  The Service's selector and port are read then: a Service changed later is not followed.

NetworkPolicies add up: a pod may do what any policy that selects it allows, and is isolated
by each type of any that selects it. So every trainer pod is allowed exactly what its own
policy allowed when each job had one holding all three parts: the chart's egress, the Hub's when
it uses the Hub, its own peers when it spans nodes; no ingress otherwise. (One narrowing: the
input check's pod, which needs no network and carries no Hub label, no longer gets a Hub job's
HTTPS rule.) A job of one node, the usual kind, costs no policy write: one per namespace instead
of one per job, made with the namespace's trainer identity before its first Job (identity.py)
and kept with that identity; selecting no pod when no job runs, it allows nothing.

The fence (operator-fence-policy.yaml, `finetune-fence-networkpolicies`) admits exactly these
shapes from the operator: the two shared ones by name, unowned, selecting trainer pods by those
labels; the per-job ones owned, naming the job's own pods; the chart's rules, the peer rule, and
for `<job>-rewards` egress only, to pods of the namespace by their labels on named ports.
"""

from collections.abc import Mapping, Sequence
from typing import Any, Final

from finetune_api.constants import LABEL_COMPONENT, LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY
from finetune_api.contract import COMPONENT_TRAINER
from finetune_api.services import ServiceUrl
from finetune_api.spec import FineTuneJobSpec

from ..children import HUB_EGRESS_LABEL, OBJECT_EGRESS_LABEL, Owner, labels, metadata
from ..setting_parsers import TrainerNetwork

SUFFIX: Final = "-network"
SERVICES_SUFFIX: Final = "-rewards"
TRAINERS: Final = "finetune-trainers"
HUB_TRAINERS: Final = "finetune-trainers-hub"
OBJECT_TRAINERS: Final = "finetune-trainers-objects"
# Every trainer pod of the namespace carries these (children.labels), and no other pod the
# operator makes.
TRAINER_PODS: Final = {LABEL_COMPONENT: COMPONENT_TRAINER, LABEL_MANAGED_BY: MANAGED_BY}


def policy_name(job: str) -> str:
    # Job names are at most 52 characters: the name stays within 63.
    return job + SUFFIX


def services_policy_name(job: str) -> str:
    # Job names are at most 52 characters: the name stays within 63.
    return job + SERVICES_SUFFIX


def peers(owner: Owner) -> list[dict[str, Any]]:
    """The job's own pods, in its own namespace (no namespaceSelector: this namespace only)."""
    return [{"podSelector": {"matchLabels": {LABEL_JOB: owner.name}}}]


def _policy(meta: dict[str, Any], pods: dict[str, str], ingress: list[Any], egress: list[Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            "podSelector": {"matchLabels": pods},
            # Both types always: with no ingress rule, nothing reaches a trainer of one pod.
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": egress,
        },
    }


def _shared_metadata(namespace: str, name: str) -> dict[str, Any]:
    # No owner: the policy serves every job of the namespace and outlives each of them.
    return {"name": name, "namespace": namespace, "labels": dict(TRAINER_PODS)}


def namespace_policies(namespace: str, rules: TrainerNetwork) -> list[dict[str, Any]]:
    """The policies every trainer pod of the namespace is under: the chart's egress for all of
    them, and the Hub's HTTPS rule for the pods of Hub jobs (when the chart gives one)."""
    egress = [dict(rule) for rule in rules.egress]
    out = [_policy(_shared_metadata(namespace, TRAINERS), dict(TRAINER_PODS), [], egress)]
    if rules.hub_egress is not None:
        hub_pods = {**TRAINER_PODS, HUB_EGRESS_LABEL: "true"}
        out.append(_policy(_shared_metadata(namespace, HUB_TRAINERS), hub_pods, [], [dict(rules.hub_egress)]))
    if rules.object_egress:
        object_pods = {**TRAINER_PODS, OBJECT_EGRESS_LABEL: "true"}
        object_rules = [dict(rule) for rule in rules.object_egress]
        out.append(_policy(_shared_metadata(namespace, OBJECT_TRAINERS), object_pods, [], object_rules))
    return out


def job_policy(owner: Owner, spec: FineTuneJobSpec, rules: TrainerNetwork) -> dict[str, Any] | None:
    """The policy of one job's own pods: for a job of several nodes, the ports they open to each
    other and to no other pod; None for a job of one pod (the namespace's policies cover it)."""
    if not spec.resources.multinode:
        return None
    ports = [dict(port) for port in rules.peer_ports]
    ingress = [{"from": peers(owner), "ports": ports}]
    egress = [{"to": peers(owner), "ports": [dict(port) for port in ports]}]
    return _policy(metadata(owner, policy_name(owner.name)), labels(owner.name), ingress, egress)


def _service_rule(call: ServiceUrl, service: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(the egress rule to the Service's pods, or what the Service lacks for one)."""
    spec = service.get("spec") or {}
    selector = spec.get("selector") or {}
    if spec.get("type") == "ExternalName" or not selector:
        return None, "it selects no pods, and the job's NetworkPolicy reaches a Service's pods by its selector"
    port = next((p for p in spec.get("ports") or [] if p.get("port") == call.port), None)
    if port is None:
        known = ", ".join(str(p.get("port")) for p in spec.get("ports") or []) or "none"
        return None, f"it has no port {call.port} (its ports: {known})"
    # The pods' own port: a number or a container port's name, as a NetworkPolicy takes both.
    target = port.get("targetPort") or call.port
    to = [{"podSelector": {"matchLabels": dict(selector)}}]
    return {"to": to, "ports": [{"protocol": port.get("protocol") or "TCP", "port": target}]}, None


def service_egress(
    calls: Sequence[ServiceUrl], services: Mapping[str, Mapping[str, Any] | None], fenced: bool
) -> tuple[list[dict[str, Any]], str | None]:
    """The egress rules to the Services a job's trainer calls, as read (`services`: each by its
    name, None where it is missing), or why the job waits for them: a missing Service, and where
    its trainers are fenced (`fenced`: the chart's trainer policies on), one that selects no pods
    or has no port its URL names. Unfenced, there is nothing to allow: no rule."""
    rules: list[dict[str, Any]] = []
    for call in calls:
        service = services.get(call.service)
        lacks = "the namespace has none" if service is None else None
        rule = None
        if service is not None and fenced:
            rule, lacks = _service_rule(call, service)
        if lacks is not None:
            return [], f"waiting for Service {call.service!r} ({call.field}): {lacks}"
        if rule is not None and rule not in rules:
            rules.append(rule)
    return rules, None


def services_policy(owner: Owner, egress: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The policy that lets one job's pods reach the Services its trainer calls (`service_egress`'s
    rules), and no more; None for a job that calls none. Ingress: none (the shared policy's)."""
    if not egress:
        return None
    rules = [dict(rule) for rule in egress]
    return _policy(metadata(owner, services_policy_name(owner.name)), labels(owner.name), [], rules)

"""A GRPO job whose rewards call Services of its namespace (`http` rewards), pure: the operator
reads each Service before the Job, waits (Pending, ServiceMissing, one Warning) while one is
missing or, with the trainers fenced, selects no pods or lacks the URL's port, and then makes
`<job>-rewards`, owned by the job, letting its pods reach exactly the Services' pods on their
target ports; a URL naming another namespace fails the job. The fence's side is in
tests/security/test_fence.py, the operator doing it on the control plane in
tests/operator/test_e2e_network.py."""

import dataclasses
import json
from typing import Any

import pytest

from finetune_api.constants import LABEL_JOB
from finetune_api.objectives import services_of
from finetune_operator.builders import network
from finetune_operator.children import labels
from finetune_operator.decide import decide, desired_children, network_children
from finetune_operator.settings import SETTINGS as TABLE
from finetune_operator.settings import Settings, from_env
from finetune_operator.status.observation import SERVICE_MISSING
from tests.operator.test_decide import PENDING, finetunejob, seen
from tests.support.harness import TRAINER_NETWORK
from tests.support.specs import OWNER, SETTINGS, spec

RULES = from_env({TABLE["trainer_network"].env: json.dumps(TRAINER_NETWORK)}).trainer_network
# The operator's defaults (test_decide.py's) with the chart's trainer policies on.
FENCED = Settings(trainer_network=RULES)
JUDGE = {"name": "judge", "http": {"url": "http://judge:8080/score"}}
SCORER = {"name": "scorer", "weight": 0.5, "http": {"url": "http://scorer.team-a.svc.cluster.local/v1"}}
ANSWER = {"name": "right", "answer": {"field": "answer"}}


def grpo(*rewards: dict[str, Any]) -> dict[str, Any]:
    """The spec fields of a GRPO job of the tiny shape (tests/support/specs.py) with `rewards`."""
    training = {"method": "grpo", "grpo": {"maxCompletionLength": 16, "rewards": list(rewards)}}
    return {"training": training, "dataset": {"source": {"pvc": {"claimName": "datasets"}}, "format": "prompt"}}


def service(name: str, selector: dict[str, str] | None, *ports: dict[str, Any], kind: str = "ClusterIP") -> Any:
    """A Service as the API server returns it (targetPort and protocol defaulted)."""
    listed = [{"protocol": "TCP", **p} for p in ports]
    return {
        "metadata": {"name": name, "namespace": OWNER.namespace},
        "spec": {"type": kind, "selector": selector, "ports": listed},
    }


JUDGE_SERVICE = service("judge", {"app": "judge"}, {"port": 8080, "targetPort": "http"})
SCORER_SERVICE = service("scorer", {"app": "scorer", "tier": "eval"}, {"port": 80, "targetPort": 9000})
READ = {"judge": JUDGE_SERVICE, "scorer": SCORER_SERVICE}


def test_the_policy_lets_the_jobs_pods_reach_each_services_pods_on_its_target_port_alone() -> None:
    shape = spec(**grpo(ANSWER, JUDGE, SCORER, {**JUDGE, "name": "judge-again"}))
    children = network_children(OWNER, shape, FENCED, READ)
    (policy,) = children
    assert policy["metadata"]["name"] == network.services_policy_name(OWNER.name) == "tiny-rewards"
    assert policy["metadata"]["ownerReferences"] == [OWNER.reference()]
    assert policy["metadata"]["labels"][LABEL_JOB] == OWNER.name
    assert policy["spec"] == {
        "podSelector": {"matchLabels": labels(OWNER.name)},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": [
            # A Service called by two rewards is one rule.
            {
                "to": [{"podSelector": {"matchLabels": {"app": "judge"}}}],
                "ports": [{"protocol": "TCP", "port": "http"}],
            },
            {
                "to": [{"podSelector": {"matchLabels": {"app": "scorer", "tier": "eval"}}}],
                "ports": [{"protocol": "TCP", "port": 9000}],
            },
        ],
    }


def test_no_policy_for_a_job_calling_no_service_nor_where_trainers_are_not_fenced() -> None:
    assert network_children(OWNER, spec(**grpo(ANSWER)), FENCED, {}) == []
    assert network_children(OWNER, spec(**grpo(JUDGE)), SETTINGS, READ) == []
    # The pre-flight's pod calls no Service: its policies are made without them.
    assert network_children(OWNER, spec(**grpo(JUDGE)), FENCED) == []


@pytest.mark.parametrize(
    ("services", "fenced", "expected"),
    [
        (
            {"judge": None},
            False,
            "waiting for Service 'judge' (spec.training.grpo.rewards[0].http.url): the namespace has none",
        ),
        (
            {"judge": service("judge", None, {"port": 8080, "targetPort": 8080})},
            True,
            "waiting for Service 'judge' (spec.training.grpo.rewards[0].http.url): it selects no pods, and the job's "
            "NetworkPolicy reaches a Service's pods by its selector",
        ),
        (
            {"judge": service("judge", None, kind="ExternalName")},
            True,
            "waiting for Service 'judge' (spec.training.grpo.rewards[0].http.url): it selects no pods",
        ),
        (
            {"judge": service("judge", {"app": "judge"}, {"port": 80, "targetPort": 8080})},
            True,
            "waiting for Service 'judge' (spec.training.grpo.rewards[0].http.url): it has no port 8080 (its ports: 80)",
        ),
    ],
    ids=["missing", "no selector", "external name", "no such port"],
)
def test_a_service_the_policy_cannot_reach_is_waited_for_naming_it(
    services: dict[str, Any], fenced: bool, expected: str
) -> None:
    calls = services_of(spec(**grpo(JUDGE)).training)
    rules, waiting = network.service_egress(calls, services, fenced)
    assert rules == [] and waiting is not None and waiting.startswith(expected), waiting
    if fenced:  # where trainers are not fenced, a Service that exists is enough
        assert network.service_egress(calls, services, False) == ([], None)


def test_the_job_reads_its_services_then_makes_the_rewards_policy_before_its_job() -> None:
    job = finetunejob(PENDING, **grpo(JUDGE, SCORER))
    first = decide(dataclasses.replace(seen(job), settings=FENCED))
    assert first.read_services == ("judge", "scorer") and first.create == () and not first.writes
    made = decide(dataclasses.replace(seen(job), settings=FENCED, services_read=True, services=READ))
    assert [(c["kind"], c["metadata"]["name"]) for c in made.create] == [
        ("NetworkPolicy", "tiny-rewards"),
        ("Job", "tiny"),
    ]
    assert made.create == tuple(desired_children(OWNER, spec(**grpo(JUDGE, SCORER)), FENCED, READ))


def test_a_missing_service_keeps_the_job_pending_saying_which_with_one_warning() -> None:
    job = finetunejob(PENDING, **grpo(JUDGE))
    waits = decide(dataclasses.replace(seen(job), settings=FENCED, services_read=True, services={"judge": None}))
    assert waits.create == () and waits.phase == "Pending" and waits.status_patch is not None
    message = "waiting for Service 'judge' (spec.training.grpo.rewards[0].http.url): the namespace has none"
    assert waits.status_patch["message"] == message
    running = next(c for c in waits.status_patch["conditions"] if c["type"] == "Running")
    assert (running["status"], running["reason"], running["message"]) == ("False", SERVICE_MISSING, message)
    assert [(e.type, e.reason, e.message) for e in waits.events] == [("Warning", SERVICE_MISSING, message)]
    # Said once: the next pass, with the same status, posts nothing more.
    again = finetunejob({**PENDING, **waits.status_patch}, **grpo(JUDGE))
    still = decide(dataclasses.replace(seen(again), settings=FENCED, services_read=True, services={"judge": None}))
    assert still.events == () and still.status_patch is None


def test_a_reward_service_of_another_namespace_fails_the_job_naming_the_field() -> None:
    other = {"name": "judge", "http": {"url": "http://judge.team-b:8080/score"}}
    actions = decide(dataclasses.replace(seen(finetunejob(**grpo(ANSWER, other))), settings=FENCED))
    assert actions.phase == "Failed" and actions.create == () and actions.read_services == ()
    assert actions.status_patch is not None
    assert actions.status_patch["message"] == (
        "spec.training.grpo.rewards[1].http.url: a reward service must be in the job's namespace (team-a), not team-b"
    )
    failed = next(c for c in actions.status_patch["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "Invalid"

"""The children of a job of several nodes: an Indexed Job whose pods find each other through a
headless Service, with the launcher's environment the trainer reads. Pure builders."""

from typing import Any

from finetune_api import multinode
from finetune_api.constants import LABEL_JOB
from finetune_api.reasons import ExitReason, parse_termination_message, reason_for_exit_code, termination_message
from finetune_operator.builders import job, pvc
from finetune_operator.builders.multinode import indexed_job, launch_environment, service
from tests.support.specs import OWNER, SETTINGS, spec

TWO_NODES = {"resources": {"gpus": 4, "nodes": 2}}


def env_of(body: dict[str, Any]) -> dict[str, Any]:
    container = body["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_one_node_renders_exactly_the_job_of_today() -> None:
    one = spec()
    assert not one.resources.multinode
    assert indexed_job(OWNER, one, SETTINGS) == job.job(OWNER, one, SETTINGS)
    explicit = spec(resources={"gpus": 0, "cpu": "1", "memory": "2Gi", "nodes": 1})
    assert indexed_job(OWNER, explicit, SETTINGS) == job.job(OWNER, spec(), SETTINGS)
    claim = pvc.output_pvc(OWNER, spec(output={"pvc": None, "storage": {"size": "1Gi"}}))
    assert claim is not None and claim["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_two_nodes_are_an_indexed_job_done_when_index_0_succeeds() -> None:
    two = spec(**TWO_NODES)
    body = indexed_job(OWNER, two, SETTINGS)
    single = job.job(OWNER, two, SETTINGS)
    job_spec = body["spec"]
    assert job_spec["completionMode"] == "Indexed"
    assert job_spec["completions"] == job_spec["parallelism"] == 2
    assert job_spec["successPolicy"] == {"rules": [{"succeededIndexes": "0", "succeededCount": 1}]}
    # Retries as for one pod: the same failure policy, a replacement only once the old pod is gone.
    assert job_spec["podFailurePolicy"] == job.pod_failure_policy()
    assert job_spec["podReplacementPolicy"] == "Failed"
    # A gang attempt fails up to one pod per node: the spec's limit counts attempts.
    assert job_spec["backoffLimit"] == 2 * single["spec"]["backoffLimit"]
    assert job_spec["template"]["spec"]["subdomain"] == service(OWNER, two)["metadata"]["name"] == "tiny"
    assert body["metadata"] == single["metadata"]
    # The pods carry the label the chart's multi-node NetworkPolicy selects; a job of one pod does not.
    assert job_spec["template"]["metadata"]["labels"][multinode.MULTINODE_LABEL] == "true"
    assert multinode.MULTINODE_LABEL not in single["spec"]["template"]["metadata"]["labels"]
    # Every pod asks for its own GPUs: gpus is per pod.
    limits = job_spec["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits[SETTINGS.gpu_resource] == "4"


def test_the_launcher_gets_every_setting_it_reads_and_the_trainer_gets_nothing_else_new() -> None:
    two = spec(**TWO_NODES)
    env = env_of(indexed_job(OWNER, two, SETTINGS))
    assert env[multinode.NNODES_ENV] == "2"
    assert env[multinode.RDZV_ENDPOINT_ENV] == f"tiny-0.tiny:{multinode.RDZV_PORT}"
    assert env[multinode.NODE_DOMAIN_ENV] == "tiny"
    assert env[multinode.RDZV_TIMEOUT_ENV] == str(multinode.DEFAULT_RDZV_TIMEOUT_S)
    # The node rank comes from Kubernetes, and the other names are the trainer's own.
    assert multinode.NODE_RANK_ENV not in env and multinode.NODE_ADDR_ENV not in env
    added = set(env) - set(env_of(job.job(OWNER, two, SETTINGS)))
    assert added == {e["name"] for e in launch_environment(OWNER, two)}
    assert added <= set(multinode.LAUNCH_ENV)
    [port] = indexed_job(OWNER, two, SETTINGS)["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert port == {"name": "rendezvous", "containerPort": multinode.RDZV_PORT, "protocol": "TCP"}


def test_the_headless_service_is_owned_by_the_job_and_exposes_the_rendezvous_port_only() -> None:
    two = spec(**TWO_NODES)
    svc = service(OWNER, two)
    assert svc["metadata"]["ownerReferences"] == [OWNER.reference()]
    assert svc["metadata"]["namespace"] == "team-a"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert [(p["name"], p["port"], p["protocol"]) for p in svc["spec"]["ports"]] == [
        ("rendezvous", multinode.RDZV_PORT, "TCP")
    ]
    # It selects exactly the job's trainer pods.
    pod_labels = indexed_job(OWNER, two, SETTINGS)["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["selector"][LABEL_JOB] == "tiny"


def test_the_endpoint_names_the_pod_of_index_0_by_the_name_the_service_gives_it() -> None:
    assert multinode.pod_hostname("tiny", 0) == "tiny-0"
    assert multinode.rendezvous_endpoint("tiny") == "tiny-0.tiny:29400"
    # The longest job name still makes a hostname that is a DNS label.
    longest = "a" * 52
    assert len(multinode.pod_hostname(longest, 63)) <= 63


def test_an_output_volume_the_operator_creates_for_several_nodes_is_read_write_many() -> None:
    claim = pvc.output_pvc(OWNER, spec(output={"pvc": None, "storage": {"size": "1Gi"}}, **TWO_NODES))
    assert claim is not None and claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_a_rendezvous_timeout_is_retried_and_counted_by_the_pod_failure_policy() -> None:
    """A gang that cannot form retries, each attempt counted against backoffLimit, so it ends."""
    fail_job, _, ignore = job.pod_failure_policy()["rules"]
    code = int(ExitReason.RendezvousTimeout)
    assert code not in fail_job["onExitCodes"]["values"] and code not in ignore["onExitCodes"]["values"]
    assert reason_for_exit_code(code) == "RendezvousTimeout"
    message = termination_message(ExitReason.RendezvousTimeout, "node 1 of 2 did not meet every node")
    assert parse_termination_message(message) == ("RendezvousTimeout", "node 1 of 2 did not meet every node")

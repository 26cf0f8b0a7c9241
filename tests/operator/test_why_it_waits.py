"""Why a job waits, decided from what a reconcile saw: no node of its product can ever hold it
(Schedulable=False, one Warning, the status message), the Job controller cannot create its pod
(a ResourceQuota's words, Scheduled=False FailedCreate), and the same for the input check's pod."""

from typing import Any

from finetune_operator.decide import Actions, decide
from finetune_operator.runtime.cache import Refusal
from finetune_plan.nodes import NodeFacts
from tests.operator.test_decide import PENDING, batch_job, finetunejob, job_pod, seen
from tests.support.specs import OWNER

P40_NODES = tuple(NodeFacts(f"gpu-p40-{i}", "Tesla-P40", 4, 256 * 2**30) for i in range(4))
QUOTA_SAID = (
    'pods "tiny-abcde" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=4, '
    "used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=2"
)


def conditions(actions: Actions) -> dict[str, dict[str, Any]]:
    assert actions.status_patch is not None
    return {c["type"]: c for c in actions.status_patch["conditions"]}


def gpu_job(gpus: int, status: dict[str, Any] | None = PENDING, **resources: Any) -> dict[str, Any]:
    return finetunejob(status=status, resources={"gpus": gpus, "cpu": "2", "memory": "8Gi", **resources})


def test_a_job_no_node_can_hold_waits_under_a_warning_naming_the_largest_node_and_the_fix() -> None:
    actions = decide(seen(gpu_job(16), job=batch_job(), nodes=P40_NODES))
    assert actions.phase == "Pending"  # nodes may yet be added: a warning, not a failure
    said = conditions(actions)["Schedulable"]
    assert (said["status"], said["reason"]) == ("False", "TooManyGpusPerNode")
    assert "no Tesla-P40 node has more than 4" in said["message"]
    assert "resources.nodes: 4 with gpus: 4" in said["message"]
    assert actions.status_patch is not None
    assert actions.status_patch["message"] == f"TooManyGpusPerNode: {said['message']}"
    assert [(e.type, e.reason) for e in actions.events] == [("Warning", "TooManyGpusPerNode")]
    # Written: said once, not again on the next pass.
    written = gpu_job(16, status={**PENDING, **actions.status_patch})
    again = decide(seen(written, job=batch_job(), nodes=P40_NODES))
    assert not again.events


def preflight_job(**status: Any) -> dict[str, Any]:
    owner = [{"kind": "FineTuneJob", "name": OWNER.name, "uid": OWNER.uid, "controller": True}]
    meta = {"name": f"{OWNER.name}-preflight", "namespace": OWNER.namespace, "uid": "preflight-uid"}
    return {"metadata": {**meta, "ownerReferences": owner}, "spec": {}, "status": status}


def test_the_warning_comes_while_the_inputs_are_checked_and_lifts_once_a_node_holds_it() -> None:
    checking = decide(seen(gpu_job(8), preflight=preflight_job(), nodes=P40_NODES))
    assert conditions(checking)["Schedulable"]["status"] == "False"
    assert checking.status_patch is not None and checking.status_patch["message"].startswith("TooManyGpusPerNode:")
    first = decide(seen(gpu_job(8), nodes=P40_NODES))
    assert [c["kind"] for c in first.create] == ["Job"]  # the Job is still made: nodes may come
    warned = decide(seen(gpu_job(8), job=batch_job(), nodes=P40_NODES))
    assert conditions(warned)["Schedulable"]["status"] == "False"
    big = (*P40_NODES, NodeFacts("gpu-p40-big", "Tesla-P40", 8, 512 * 2**30))
    written = gpu_job(8, status={**PENDING, **(warned.status_patch or {})})
    lifted = decide(seen(written, job=batch_job(), nodes=big))
    said = conditions(lifted)["Schedulable"]
    assert (said["status"], said["reason"]) == ("True", "NodesFit")
    assert lifted.status_patch is not None and "TooManyGpusPerNode" not in str(lifted.status_patch.get("message"))
    assert not lifted.events


def test_a_job_that_fits_or_runs_on_the_cpu_or_where_nodes_are_unknown_has_no_such_condition() -> None:
    for spec, nodes in ((gpu_job(4), P40_NODES), (gpu_job(0), P40_NODES), (gpu_job(16), None)):
        actions = decide(seen(spec, job=batch_job(), nodes=nodes))
        assert actions.status_patch is not None
        assert "Schedulable" not in conditions(actions)
        assert not actions.events


def test_a_product_no_node_carries_is_named_with_what_the_nodes_carry() -> None:
    actions = decide(seen(gpu_job(4, gpuProduct="NVIDIA-H100-80GB-HBM3"), job=batch_job(), nodes=P40_NODES))
    said = conditions(actions)["Schedulable"]
    assert said["reason"] == "NoNodeOfProduct"
    assert "(nodes have: Tesla-P40 x 4)" in said["message"]


def test_a_quota_that_refuses_the_pod_is_said_in_its_own_words_until_a_pod_is_made() -> None:
    refused = {"job-uid": Refusal("job-uid", "2026-01-01T00:00:05Z", QUOTA_SAID)}
    actions = decide(seen(gpu_job(4), job=batch_job(), nodes=P40_NODES, refusals=refused))
    said = conditions(actions)["Scheduled"]
    assert (said["status"], said["reason"]) == ("False", "FailedCreate")
    assert said["message"] == f"the Job cannot create its pod: {QUOTA_SAID}"
    assert actions.status_patch is not None and actions.status_patch["message"] == said["message"]
    # A pod made after the refusal: the quota let it through, its words are old news.
    later = job_pod("b", "Pending", created="2026-01-01T00:00:08Z")
    placed = decide(seen(gpu_job(4), job=batch_job(), pods=[later], nodes=P40_NODES, refusals=refused))
    assert placed.status_patch is not None and "exceeded quota" not in str(placed.status_patch)


def test_a_quota_that_refuses_the_input_checks_pod_is_said_while_it_checks() -> None:
    check = preflight_job()
    refused = {"preflight-uid": Refusal("preflight-uid", "2026-01-01T00:00:05Z", QUOTA_SAID)}
    actions = decide(seen(finetunejob(status=PENDING), preflight=check, refusals=refused))
    assert actions.status_patch is not None
    assert actions.status_patch["message"].endswith(f"; its pod cannot be created: {QUOTA_SAID}")
    assert conditions(actions)["Running"]["reason"] == "CheckingInputs"

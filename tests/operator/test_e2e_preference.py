"""DPO through the real operator, on the control plane and the node agent's two nodes: a job of
two nodes (one process each, a c10d rendezvous on pod 0) trains the adapter that one pod of two
processes trains, as SFT's gang does (test_e2e_multinode.py, whose recipe and placement this
reuses). Each micro-batch is DPO's reference forward (the adapter off, no gradients) and the
trained forward of the pairs' chosen and rejected answers, on every rank.

Serial, as SFT's gang test: the agent's pods share the host's network namespace, and a gang's
pod 0 listens on the rendezvous port (29400).
"""

from pathlib import Path
from typing import Any

import pytest

from finetune_trainer.model.tiny_model import write_preference
from tests.support.harness import Jobs, OperatorProcess, wait_for
from tests.support.specs import body
from tests.support.training import (
    adapter_tensors,
    assert_same_trained_adapter,
    max_difference,
    summary,
    trainer_event,
    watch_until_done,
)

from .test_e2e_multinode import CHECKPOINTS, GANG, LOCAL_NODES, ONE_POD, TRAINING, apart, index_of

pytestmark = [pytest.mark.cluster, pytest.mark.trainer]

PAIRS = "tiny/preference.jsonl"


def dpo_spec(resources: dict[str, Any], **extra: Any) -> dict[str, Any]:
    dataset = {"source": {"pvc": {"claimName": "datasets", "path": PAIRS}}, "format": "preference"}
    training = {**TRAINING, "method": "dpo"}
    return body(training=training, dataset=dataset, checkpoints=CHECKPOINTS, resources=resources, **extra)


@pytest.mark.serial
def test_a_dpo_job_of_two_nodes_trains_the_adapter_of_one_pod_with_two_processes(
    cluster: Any, namespace: str, jobs: Jobs, training_volumes: dict[str, Path], operator: OperatorProcess
) -> None:
    write_preference(training_volumes["datasets"] / PAIRS, count=64)
    jobs.create("one-pod", dpo_spec(ONE_POD))
    placement = {"tolerations": LOCAL_NODES, "affinity": apart("pair")}
    jobs.create("pair", dpo_spec(GANG, placement=placement))

    reference = watch_until_done(jobs, "one-pod")[2]
    assert reference["phase"] == "Succeeded", reference
    status = watch_until_done(jobs, "pair")[2]
    assert status["phase"] == "Succeeded", status
    assert status["restarts"] == 0 and status["nodes"]["total"] == 2
    pods = jobs.pods("pair")
    assert sorted(index_of(p) for p in pods) == [0, 1]
    assert len({p["status"]["podIP"] for p in pods}) == 2
    # Pod 0 holds rank 0, which reports: its last step's figures are DPO's.
    first = next(p for p in pods if index_of(p) == 0)["metadata"]["name"]
    # The node agent copies the pod's output into its log on its own time: read once the last
    # line (`done`) is there.
    wait_for(lambda: trainer_event(cluster, namespace, first, "done"), 90, "pod 0's last line in its log")
    last = trainer_event(cluster, namespace, first, "progress")
    assert last is not None and last["step"] == TRAINING["maxSteps"], last
    assert 0.0 <= last["rewardAccuracy"] <= 1.0 and "rewardMargin" in last, last
    for name in ("one-pod", "pair"):
        done = summary(training_volumes, name)
        assert (done["worldSize"], done["finalStep"], done["ranksInStep"]) == (2, TRAINING["maxSteps"], True)
        guard = done["precisionGuard"]
        assert guard["halfParameters"] == guard["halfBuffers"] == guard["halfActivations"] == 0
    expected = adapter_tensors(training_volumes, reference)
    got = adapter_tensors(training_volumes, status)
    print(f"dpo: two nodes of one process against one pod of two: max abs difference {max_difference(got, expected)}")
    assert_same_trained_adapter(got, expected)

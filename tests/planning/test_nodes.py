"""Whether any node of a job's product can ever hold its pods (finetune_plan.nodes.room): the one
verdict `ftjob plan` and the operator give, each with what would run instead."""

from typing import Any

import pytest

from finetune_plan.nodes import (
    NO_PRODUCT,
    TOO_FEW_NODES,
    TOO_LITTLE_MEMORY,
    TOO_MANY_GPUS,
    NodeFacts,
    Nodes,
    facts,
    product_nodes,
    room,
    split,
)
from finetune_plan.pod import WONT_FIT, verdict
from tests.support.specs import spec

GIB = 2**30
# The local cluster's GPU nodes (hack/cluster/nodes.py): four P40 nodes and one A100 node, 4 GPUs each.
CLUSTER = Nodes(
    (
        *(NodeFacts(f"gpu-p40-{i}", "Tesla-P40", 4, 256 * GIB) for i in range(4)),
        NodeFacts("gpu-a100-0", "NVIDIA-A100-SXM4-80GB", 4, 256 * GIB),
    ),
    "the cluster's nodes",
)


def judged(**resources: Any) -> Any:
    return room(spec(resources={"cpu": "1", "memory": "2Gi", **resources}), CLUSTER)


def test_sixteen_gpus_on_four_gpu_nodes_names_the_largest_node_and_a_split_that_fits() -> None:
    found = judged(gpus=16)
    assert (found.fits, found.reason) == (False, TOO_MANY_GPUS)
    assert found.message.startswith("16 GPUs per pod: no Tesla-P40 node has more than 4 (4 nodes of 4 GPUs")
    assert "resources.nodes: 4 with gpus: 4 (the same 16 GPUs)" in found.message


def test_more_gpus_than_the_whole_pool_says_the_most_there_is() -> None:
    found = judged(gpus=64)
    assert found.reason == TOO_MANY_GPUS
    assert "at most 16 GPUs of Tesla-P40 here, e.g. resources.gpus: 4" in found.message


def test_a_product_no_node_has_lists_what_the_nodes_carry() -> None:
    found = judged(gpus=4, gpuProduct="NVIDIA-H100-80GB-HBM3")
    assert found.reason == NO_PRODUCT
    assert found.message == (
        "no node has nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3 (nodes have: Tesla-P40 x 4, "
        "NVIDIA-A100-SXM4-80GB x 1); set resources.gpuProduct to one of them"
    )


def test_more_pods_than_nodes_that_hold_one_is_too_few_nodes() -> None:
    found = judged(gpus=4, nodes=5)
    assert found.reason == TOO_FEW_NODES
    assert found.message.startswith("5 pods of 4 GPUs: only 4 nodes of Tesla-P40 can hold one")
    # The A100's one node cannot hold 5 pods either: not offered.
    assert "NVIDIA-A100" not in found.message


def test_a_pod_above_every_nodes_memory_is_refused_naming_the_field() -> None:
    found = room(spec(resources={"gpus": 4, "cpu": "1", "memory": "300Gi"}), CLUSTER, 300 * GIB)
    assert found is not None and found.reason == TOO_LITTLE_MEMORY
    assert "no Tesla-P40 node with 4 GPUs has more than 256.0 GiB allocatable" in found.message


def test_what_fits_says_where_and_a_cpu_job_is_not_judged() -> None:
    found = judged(gpus=4, nodes=2)
    assert found.fits and found.message == "4 nodes of Tesla-P40 can hold a pod of 4 GPUs (the cluster's nodes)"
    assert judged(gpus=0) is None


def test_without_a_cluster_the_planners_server_of_eight_gpus_stands_for_the_nodes() -> None:
    offline = product_nodes("Tesla-P40")
    many = room(spec(resources={"gpus": 16, "cpu": "1", "memory": "2Gi"}), offline)
    assert many is not None and many.reason == TOO_MANY_GPUS
    assert "resources.nodes: 2 with gpus: 8" in many.message
    # As many servers as a job needs: no count to run short of.
    wide = room(spec(resources={"gpus": 8, "nodes": 16, "cpu": "1", "memory": "2Gi"}), offline)
    assert wide is not None and wide.fits


@pytest.mark.parametrize(
    ("total", "gpus", "counted", "expected"),
    [
        (16, [4, 4, 4, 4], True, (4, 4)),
        (16, [4, 4, 4], True, None),
        (12, [8, 4, 4, 4], True, (3, 4)),
        (6, [8], False, (1, 6)),
    ],
)
def test_split_takes_the_fewest_nodes(total: int, gpus: list[int], counted: bool, expected: Any) -> None:
    assert split(total, gpus, counted) == expected


def test_a_node_body_reads_as_its_product_and_allocatable() -> None:
    node = {
        "metadata": {"name": "gpu-p40-0", "labels": {"nvidia.com/gpu.product": "Tesla-P40"}},
        "status": {"allocatable": {"nvidia.com/gpu": "4", "memory": "263856012Ki"}},
    }
    assert facts(node) == NodeFacts("gpu-p40-0", "Tesla-P40", 4, 263856012 * 1024)
    assert facts({"metadata": {"name": "cpu-0", "labels": {}}}) is None


def test_the_verdict_names_the_gpus_first_then_the_nodes() -> None:
    """One verdict: a spec whose GPUs cannot hold it is WontFit whatever the nodes; one that fits
    its GPUs but no node is the nodes' (and those may yet change, where a WontFit is for good)."""
    from finetune_plan.pod import pod_plan

    known = {"source": {"hub": {"id": "meta-llama/Llama-3.3-70B-Instruct"}}}
    small = spec(model=known, resources={"gpus": 2, "cpu": "1"})
    plan = pod_plan(small).launch
    assert plan is not None and plan.plan is not None
    said = verdict(small, plan.plan, CLUSTER, None)
    assert said.reason == WONT_FIT and not said.nodes_short
    wide = spec(resources={"gpus": 16, "cpu": "1", "memory": "2Gi"})
    said = verdict(wide, None, CLUSTER, None)
    assert said.reason == TOO_MANY_GPUS and said.nodes_short
    assert verdict(wide, None, None, None).fits  # nodes not known, no plan: nothing to refuse

"""The pure parts of the N-process trainer: who trains on what, which rank's reason ends the pod,
and a loss taken in chunks that equals the loss taken whole."""

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from finetune_api import multinode
from finetune_api.multinode import DEFAULT_RDZV_TIMEOUT_S
from finetune_api.reasons import ExitReason
from finetune_trainer.data.batches import IGNORE, Schedule, eval_slots, make_rows
from finetune_trainer.failures import TrainerFailure
from finetune_trainer.launch.launcher import (
    VANISHED_AFTER_S,
    Nodes,
    RankFailure,
    Watchdog,
    check_placement,
    launch_config,
    nodes_from_env,
    pod_ranks,
    read_reasons,
    root_cause,
    unfinished,
)
from finetune_trainer.model.loss_head import LossHead


def schedule(world: int, accumulation: int, rows: int = 10, batch: int = 2, steps: int = 6) -> Schedule:
    return Schedule.make(
        rows=rows, batch_size=batch, accumulation=accumulation, world=world, seed=3, max_steps=steps, epochs=None
    )


def test_n_processes_with_accumulation_k_see_the_micro_batches_of_one_with_n_times_k() -> None:
    one, two = schedule(world=1, accumulation=4), schedule(world=2, accumulation=2)
    for step in range(6):
        single = dict(one.slots(step, 0))
        split = dict(two.slots(step, 0)) | dict(two.slots(step, 1))
        assert split == single, f"step {step}"
        assert sorted(dict(two.slots(step, 0))) != sorted(dict(two.slots(step, 1)))


def test_every_row_is_trained_once_per_epoch_and_past_its_end_a_slot_is_empty() -> None:
    plan = schedule(world=2, accumulation=2, rows=10, batch=2)  # 5 micro-batches, 4 per step
    assert plan.steps_per_epoch == 2
    seen = [row for step in range(2) for rank in (0, 1) for _, rows in plan.slots(step, rank) for row in rows]
    assert sorted(seen) == list(range(10))
    assert sum(1 for rank in (0, 1) for _, rows in plan.slots(1, rank) if not rows) == 3
    # The next epoch draws a new order from the same seed.
    assert plan.order(1) != plan.order(0)
    assert schedule(world=2, accumulation=2).order(1) == plan.order(1)


def test_epochs_set_the_step_count_whatever_the_process_count() -> None:
    for world, accumulation in ((1, 4), (2, 2), (4, 1)):
        made = Schedule.make(
            rows=100, batch_size=2, accumulation=accumulation, world=world, seed=0, max_steps=None, epochs=2.0
        )
        assert made.total_steps == 26


def test_eval_slots_cover_every_row_once_and_give_each_rank_as_many_micro_batches() -> None:
    slots = [eval_slots(7, 2, rank, 3) for rank in range(3)]
    assert {len(s) for s in slots} == {2}
    assert sorted(row for s in slots for batch in s for row in batch) == list(range(7))


class WordTokenizer:
    """Each character is a token; enough to test packing without a model. Like a real tokenizer
    it takes a list of texts too."""

    eos_token_id = 0

    def __call__(self, text: str | list[str], add_special_tokens: bool = True) -> dict[str, Any]:
        if isinstance(text, list):
            return {"input_ids": [self(t, add_special_tokens)["input_ids"] for t in text]}
        return {"input_ids": ([1] if add_special_tokens else []) + [ord(c) for c in text]}


def test_packing_keeps_every_token_and_restarts_positions_per_sample() -> None:
    samples = [{"prompt": "ab", "completion": "cd"}, {"text": "efgh"}, {"prompt": "x", "completion": "yz"}]
    rows = make_rows(samples, WordTokenizer(), max_length=8, packing=True)
    assert all(len(r.input_ids) <= 8 for r in rows)
    assert sum(len(r.input_ids) for r in rows) == 6 + 6 + 5
    for row in rows:
        starts = [i for i, p in enumerate(row.position_ids) if p == 0]
        assert all(row.labels[i] == IGNORE for i in starts), "no sample predicts the next one's first token"
    unpacked = make_rows(samples, WordTokenizer(), max_length=8, packing=False)
    assert unpacked[0].labels == [IGNORE, IGNORE, IGNORE, ord("c"), ord("d"), 0]  # loss on the answer only


def failure(rank: int, reason: ExitReason, at: float) -> RankFailure:
    return RankFailure(rank, reason, f"{reason.name} on {rank}", at)


def test_the_pods_reason_is_the_first_named_failure_not_its_consequences() -> None:
    reasons = [failure(0, ExitReason.TrainerError, 1.0), failure(1, ExitReason.OutOfMemory, 2.0)]
    assert root_cause(reasons, {0: 1, 1: 14}) == (ExitReason.OutOfMemory, "rank 1: OutOfMemory on 1")


def test_a_rank_killed_by_a_signal_is_a_retryable_failure_named_in_the_message() -> None:
    reason, message = root_cause([failure(0, ExitReason.TrainerError, 1.0)], {0: 1, 1: -9})
    assert reason == ExitReason.TrainerError
    assert message.startswith("rank 1 was killed by SIGKILL")


def test_a_rank_found_gone_is_named_before_the_ranks_killed_on_its_account() -> None:
    lost = RankFailure(1, ExitReason.TrainerError, "rank 1 ended without finishing", 2.0, vanished=True)
    reasons = [failure(0, ExitReason.TrainerError, 1.0), lost]
    assert root_cause(reasons, {0: -9}) == (ExitReason.TrainerError, "rank 1 ended without finishing")


def test_the_watchdog_names_a_worker_gone_unaccounted_and_stops_the_others(tmp_path: Path) -> None:
    """Real processes: rank 1 is reaped here, out of its launcher's sight, as a lost exit status is."""
    sleepers = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(3)]
    try:
        for rank, process in enumerate(sleepers):
            (tmp_path / f"rank-{rank}.pid").write_text(str(process.pid))
        (tmp_path / "rank-2.done").write_text("")  # a finished rank is never the lost one
        sleepers[2].kill()
        sleepers[2].wait()
        watchdog = Watchdog(tmp_path)
        assert watchdog.check(now=0.0) is None
        sleepers[1].kill()
        sleepers[1].wait()
        assert watchdog.check(now=1.0) is None  # the agent gets its chance first
        assert watchdog.check(now=1.0 + VANISHED_AFTER_S) == 1
        assert sleepers[0].wait(timeout=10) == -signal.SIGKILL
        [record] = read_reasons(tmp_path)
        assert (record.rank, record.vanished) == (1, True)
        assert record.message.startswith("rank 1 ended without finishing or naming a reason")
    finally:
        for process in sleepers:
            process.kill()
            process.wait()


def test_without_any_record_the_exit_codes_are_reported() -> None:
    assert root_cause([], {1: 3}) == (ExitReason.TrainerError, "a training process failed (rank 1 exited 3)")


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_the_loss_in_chunks_equals_the_loss_whole_and_so_do_its_gradients(chunk: int) -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(2, 12, 16, requires_grad=True)
    labels = torch.randint(0, 50, (2, 12))
    labels[0, :4] = IGNORE
    results = []
    for size in (0, chunk):
        wrapped = LossHead(head, size)
        wrapped.labels = labels
        loss = wrapped(hidden).reshape(())
        grads = torch.autograd.grad(loss, [hidden, head.weight])
        results.append((loss.detach(), grads))
    (whole, whole_grads), (chunked, chunked_grads) = results
    assert torch.allclose(whole, chunked, rtol=1e-5)
    for a, b in zip(whole_grads, chunked_grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


# --- several nodes: the launcher's settings from the Indexed Job's environment ---------------

NODE_1 = {
    multinode.NNODES_ENV: "2",
    multinode.NODE_RANK_ENV: "1",
    multinode.RDZV_ENDPOINT_ENV: "tiny-0.tiny:29400",
    multinode.NODE_DOMAIN_ENV: "tiny",
    "HOSTNAME": "tiny-1",
}


def test_a_pod_without_the_multinode_environment_launches_standalone_as_before() -> None:
    assert nodes_from_env({}) is None
    assert nodes_from_env({multinode.NNODES_ENV: "1"}) is None
    settings = launch_config(2, None)
    assert (settings["min_nodes"], settings["max_nodes"], settings["rdzv_endpoint"]) == (1, 1, "localhost:0")
    assert "rdzv_configs" not in settings and "local_addr" not in settings


def test_the_pod_of_index_1_joins_pod_0s_rendezvous_by_its_own_name() -> None:
    nodes = nodes_from_env(NODE_1)
    assert nodes == Nodes(
        count=2, rank=1, endpoint="tiny-0.tiny:29400", local_addr="tiny-1.tiny", timeout_s=DEFAULT_RDZV_TIMEOUT_S
    )
    settings = launch_config(4, nodes)
    assert (settings["min_nodes"], settings["max_nodes"], settings["nproc_per_node"]) == (2, 2, 4)
    assert settings["rdzv_backend"] == "c10d" and settings["max_restarts"] == 0
    assert settings["rdzv_configs"]["is_host"] is False
    assert settings["rdzv_configs"]["join_timeout"] == settings["rdzv_configs"]["read_timeout"] == 900
    host = launch_config(4, nodes_from_env(NODE_1 | {multinode.NODE_RANK_ENV: "0", "HOSTNAME": "tiny-0"}))
    assert host["rdzv_configs"]["is_host"] is True and host["local_addr"] == "tiny-0.tiny"


def test_the_pod_of_index_0_sorts_first_whatever_the_node_count() -> None:
    """c10d numbers nodes in the order of their addresses: pod 0 must be node 0, global rank 0."""
    names = [f"{multinode.pod_hostname('tiny', i)}.tiny" for i in range(64)]
    assert sorted(names)[0] == "tiny-0.tiny"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({multinode.NODE_RANK_ENV: None}, multinode.NODE_RANK_ENV),
        ({multinode.NODE_RANK_ENV: "2"}, "outside 0..1"),
        ({multinode.RDZV_ENDPOINT_ENV: "tiny-0.tiny"}, multinode.RDZV_ENDPOINT_ENV),
        ({multinode.NNODES_ENV: "two"}, multinode.NNODES_ENV),
        ({multinode.RDZV_TIMEOUT_ENV: "0"}, multinode.RDZV_TIMEOUT_ENV),
    ],
    ids=["no index", "index past the nodes", "endpoint without a port", "nodes not a number", "no time to wait"],
)
def test_a_wrong_launch_environment_is_an_invalid_config_naming_the_variable(
    change: dict[str, str | None], named: str
) -> None:
    env = {k: v for k, v in (NODE_1 | change).items() if v is not None}
    with pytest.raises(TrainerFailure) as failure:
        nodes_from_env(env)
    assert failure.value.reason == ExitReason.InvalidConfig and named in failure.value.message


def test_rank_0_outside_the_pod_of_index_0_is_refused() -> None:
    check_placement(NODE_1 | {"RANK": "1", "GROUP_RANK": "1"})
    check_placement(NODE_1 | {multinode.NODE_RANK_ENV: "0", "RANK": "0", "GROUP_RANK": "0"})
    with pytest.raises(TrainerFailure) as failure:
        check_placement(NODE_1 | {"RANK": "0", "GROUP_RANK": "0"})
    assert failure.value.reason == ExitReason.TrainerError


def test_a_pods_ranks_are_those_of_its_node(tmp_path: Path) -> None:
    for rank in (6, 7):
        (tmp_path / f"rank-{rank}.pid").write_text("1")
    assert pod_ranks(tmp_path, 4) == range(4, 8)
    (tmp_path / f"rank-{6}.done").write_text("")
    assert unfinished(tmp_path, 4) == [4, 5, 7]

"""The Lease records election writes, the timings it accepts, and its settings; pure. The
election itself, two operator processes on one Lease of a real API server, is
tests/reliability/test_leader_election.py."""

import threading
import time

import pytest

from finetune_operator.runtime.leader import LeaseTimings, claimed, holder, micro_time, released
from finetune_operator.runtime.workqueue import WorkQueue
from finetune_operator.setting_parsers import SettingsError
from finetune_operator.settings import check, from_env

STAMP = "2026-12-04T10:00:00.000000Z"


def _lease(holder_identity: str, transitions: int = 0) -> dict:
    return {
        "metadata": {"name": "l", "namespace": "ns", "resourceVersion": "7"},
        "spec": {
            "holderIdentity": holder_identity,
            "leaseDurationSeconds": 15,
            "acquireTime": "2026-12-04T09:00:00.000000Z",
            "renewTime": "2026-12-04T09:59:58.000000Z",
            "leaseTransitions": transitions,
        },
    }


def _claim(lease: dict | None, identity: str) -> dict:
    return claimed(lease, namespace="ns", name="l", identity=identity, duration_s=15, stamp=STAMP)


def test_a_new_lease_is_ours_from_now_with_no_transition() -> None:
    body = _claim(None, "a")
    assert body["spec"] == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "acquireTime": STAMP,
        "renewTime": STAMP,
        "leaseTransitions": 0,
    }
    assert "resourceVersion" not in body["metadata"]


def test_renewing_moves_only_the_renew_time_and_keeps_the_version_we_read() -> None:
    body = _claim(_lease("a", transitions=3), "a")
    assert body["spec"]["acquireTime"] == "2026-12-04T09:00:00.000000Z"
    assert body["spec"]["renewTime"] == STAMP
    assert body["spec"]["leaseTransitions"] == 3
    # The write is conditional on what we read: a concurrent writer makes it fail with 409.
    assert body["metadata"]["resourceVersion"] == "7"


def test_taking_it_over_counts_a_transition() -> None:
    body = _claim(_lease("a", transitions=3), "b")
    assert holder(body) == "b"
    assert body["spec"]["acquireTime"] == STAMP and body["spec"]["leaseTransitions"] == 4


def test_a_released_lease_has_no_holder() -> None:
    lease = released(_lease("a"))
    assert holder(lease) == "" and lease["spec"]["leaseDurationSeconds"] == 1
    assert lease["metadata"]["resourceVersion"] == "7"


def test_micro_time_is_rfc3339_with_microseconds() -> None:
    assert len(micro_time()) == len(STAMP) and micro_time().endswith("Z")


@pytest.mark.parametrize(
    ("timings", "problem"),
    [
        (LeaseTimings(15, 10, 2), None),
        (LeaseTimings(10, 10, 2), "renew deadline must be shorter"),
        (LeaseTimings(15, 2, 2), "retry period"),
        (LeaseTimings(15, 10, 0), "positive"),
    ],
)
def test_timings_that_could_hold_two_leaders_are_refused(timings: LeaseTimings, problem: str | None) -> None:
    found = timings.problem()
    assert found == problem if problem is None else problem in str(found)


def test_leader_election_settings_from_the_charts_variables() -> None:
    env = {
        "FINETUNE_LEADER_ELECTION": "true",
        "FINETUNE_LEASE_NAME": "ft",
        "POD_NAMESPACE": "finetune-system",
        "FINETUNE_LEASE_DURATION_SECONDS": "20",
        "FINETUNE_LEASE_RENEW_DEADLINE_SECONDS": "12",
        "FINETUNE_LEASE_RETRY_PERIOD_SECONDS": "3",
    }
    settings = check(from_env(env))
    assert settings.leader_election and settings.lease_name == "ft"
    assert settings.lease_namespace == "finetune-system"
    assert settings.lease_timings == LeaseTimings(20, 12, 3)
    assert not from_env({}).leader_election


def test_leader_election_needs_a_namespace_and_sane_timings() -> None:
    with pytest.raises(SettingsError, match="FINETUNE_LEASE_NAMESPACE"):
        check(from_env({"FINETUNE_LEADER_ELECTION": "true"}))
    with pytest.raises(SettingsError, match="renew deadline"):
        check(
            from_env({"FINETUNE_LEADER_ELECTION": "true", "POD_NAMESPACE": "x", "FINETUNE_LEASE_DURATION_SECONDS": "5"})
        )
    with pytest.raises(SettingsError, match="FINETUNE_LEASE_RETRY_PERIOD_SECONDS"):
        from_env({"FINETUNE_LEASE_RETRY_PERIOD_SECONDS": "soon"})


def test_a_stopped_queue_finishes_the_work_under_way_and_starts_no_more() -> None:
    """What a leader does before it gives the Lease up: no write may follow the handover."""
    started: list[str] = []
    release = threading.Event()

    def work(key: object) -> None:
        started.append(str(key))
        release.wait(5)

    queue = WorkQueue(work, workers=2).start()
    queue.add("a")
    deadline = time.monotonic() + 5
    while not started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started == ["a"]
    assert not queue.stop(0.2), "returned while work was under way"
    queue.add("b")
    release.set()
    assert queue.stop(5)
    time.sleep(0.2)
    assert started == ["a"], "work started after stop"

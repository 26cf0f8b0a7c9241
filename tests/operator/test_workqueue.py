"""The reconcile queue: each job once, never twice at a time, urgent first, the last add never lost."""

import threading
import time
from collections.abc import Callable, Hashable

from finetune_operator.runtime.workqueue import NEW, UPDATE, WorkQueue


def wait(condition: Callable[[], bool], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_adds_during_a_run_collapse_into_one_more_run() -> None:
    started, release = threading.Event(), threading.Event()
    runs: list[Hashable] = []

    def work(key: Hashable) -> None:
        runs.append(key)
        if len(runs) == 1:
            started.set()
            release.wait(5)

    queue = WorkQueue(work, workers=4).start()
    queue.add("job")
    assert started.wait(5)
    for _ in range(5):  # while the first run is busy: no second thread takes the same job
        queue.add("job")
    time.sleep(0.1)
    assert runs == ["job"]
    release.set()
    wait(lambda: len(runs) == 2)
    time.sleep(0.1)
    assert runs == ["job", "job"]  # exactly one more, started after the last add


def test_new_jobs_go_before_status_work() -> None:
    gate = threading.Event()
    order: list[Hashable] = []

    def work(key: Hashable) -> None:
        if key == "blocker":
            gate.wait(5)
        order.append(key)

    queue = WorkQueue(work, workers=1).start()
    queue.add("blocker")
    wait(lambda: queue.depth() == 0)
    queue.add("running-1", UPDATE)
    queue.add("running-2", UPDATE)
    queue.add("submitted", NEW)
    queue.add("running-1", NEW)  # raised: its old entry is skipped, it runs once
    gate.set()
    wait(lambda: len(order) == 4)
    time.sleep(0.1)
    assert order == ["blocker", "submitted", "running-1", "running-2"]


def test_a_failing_run_leaves_neither_the_job_nor_the_worker_stuck() -> None:
    ran: list[Hashable] = []

    def work(key: Hashable) -> None:
        ran.append(key)
        if len(ran) == 1:
            raise RuntimeError("boom")

    queue = WorkQueue(work, workers=1).start()
    queue.add("job")
    wait(lambda: len(ran) == 1)
    queue.add("job")
    wait(lambda: len(ran) == 2)


def test_different_jobs_do_not_wait_for_each_other() -> None:
    release = threading.Event()
    done: list[Hashable] = []

    def work(key: Hashable) -> None:
        if key == "slow":
            release.wait(5)
        done.append(key)

    queue = WorkQueue(work, workers=2).start()
    queue.add("slow")
    queue.add("quick")
    wait(lambda: done == ["quick"])
    release.set()
    wait(lambda: done == ["quick", "slow"])


def test_a_key_added_for_later_runs_when_due_and_holds_no_worker_meanwhile() -> None:
    runs: list[tuple[Hashable, float]] = []
    queue = WorkQueue(lambda key: runs.append((key, time.monotonic())), workers=1).start()
    started = time.monotonic()
    # A delay long against a loaded machine's scheduling: "now" must run before "later" is due.
    queue.add_after("later", 2.0)
    queue.add("now")
    wait(lambda: len(runs) == 2)
    assert [key for key, _ in runs] == ["now", "later"]  # the waiting key did not block the worker
    assert runs[0][1] - started < 2.0
    assert runs[1][1] - started >= 2.0


def test_retries_back_off_doubling_until_forgotten() -> None:
    runs: list[float] = []
    queue = WorkQueue(lambda key: runs.append(time.monotonic()), workers=1, retry_first_s=0.1, retry_max_s=0.4)
    assert [queue.add_rate_limited("job")[1] for _ in range(4)] == [0.1, 0.2, 0.4, 0.4]
    assert runs == []  # not started: building a queue runs nothing
    queue.start()
    wait(lambda: len(runs) == 1)
    time.sleep(0.3)
    assert len(runs) == 1  # the failures in a row came while one retry waited: still one retry
    queue.forget("job")
    assert queue.add_rate_limited("job") == (1, 0.1)

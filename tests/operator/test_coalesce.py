"""Bursts of triggers for one job collapse, and the last trigger is never lost."""

import threading
import time

import pytest

from finetune_operator.coalesce import Coalescer


def test_triggers_during_a_run_collapse_into_one_rerun():
    coalescer = Coalescer()
    started = threading.Event()
    release = threading.Event()
    runs: list[int] = []

    def slow() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            started.set()
            release.wait(5)

    first = threading.Thread(target=coalescer.run, args=("job", slow))
    first.start()
    started.wait(5)
    # Five triggers while the first run is busy: none runs on its own thread...
    assert [coalescer.run("job", slow) for _ in range(5)] == [False] * 5
    release.set()
    first.join(5)
    # ...and exactly one more run follows, after the last trigger.
    assert runs == [0, 1]


def test_different_jobs_do_not_wait_for_each_other():
    coalescer = Coalescer()
    release = threading.Event()
    done: list[str] = []
    slow = threading.Thread(target=coalescer.run, args=("a", lambda: release.wait(5)))
    slow.start()
    time.sleep(0.05)
    assert coalescer.run("b", lambda: done.append("b")) is True
    assert done == ["b"]
    release.set()
    slow.join(5)


def test_a_failing_run_does_not_leave_the_job_stuck():
    coalescer = Coalescer()

    def boom() -> None:
        raise RuntimeError("api down")

    with pytest.raises(RuntimeError):
        coalescer.run("job", boom)
    ran: list[bool] = []
    assert coalescer.run("job", lambda: ran.append(True)) is True
    assert ran == [True]

"""Status and Event writes wait their turn while Jobs are being created, and only then."""

import threading
import time
from collections.abc import Hashable

from finetune_operator.runtime.pacing import WritePacer


class Released:
    def __init__(self) -> None:
        self.keys: list[Hashable] = []
        self.times: list[float] = []
        self._lock = threading.Lock()

    def __call__(self, key: Hashable) -> None:
        with self._lock:
            self.keys.append(key)
            self.times.append(time.monotonic())

    def wait(self, count: int, timeout: float = 5) -> None:
        deadline = time.monotonic() + timeout
        while len(self.keys) < count:
            assert time.monotonic() < deadline, f"released {self.keys}, wanted {count}"
            time.sleep(0.005)


def test_nothing_is_paced_while_no_job_is_being_created() -> None:
    released = Released()
    pacer = WritePacer(released, busy_writes_per_s=1, quiet_s=1).start()
    assert all(pacer.may_write(f"job-{i}") for i in range(50))
    assert pacer.parked() == 0 and released.keys == []
    assert not pacer.creating()
    pacer.created()
    assert pacer.creating()  # the resync waits while this holds


def test_while_jobs_are_created_one_write_goes_per_slot_in_the_order_asked() -> None:
    released = Released()
    pacer = WritePacer(released, busy_writes_per_s=5, quiet_s=10).start()
    pacer.created()
    assert pacer.may_write("a")  # the first write of a burst goes at once
    assert not pacer.may_write("b")
    assert not pacer.may_write("c")
    assert not pacer.may_write("b")  # asked again while parked: still parked once
    assert pacer.parked() == 2
    released.wait(2)
    assert released.keys == ["b", "c"]
    assert released.times[1] - released.times[0] >= 0.19  # one per 1/5 s slot
    # A released job's next write goes without asking again, once.
    assert pacer.may_write("b")
    assert not pacer.may_write("b")


def test_when_creations_stop_every_parked_write_goes_at_once() -> None:
    released = Released()
    pacer = WritePacer(released, busy_writes_per_s=0.5, quiet_s=0.3).start()  # one slot per 2 s
    pacer.created()
    assert pacer.may_write("first")
    for key in ("a", "b", "c", "d"):
        assert not pacer.may_write(key)
    released.wait(4, timeout=30)
    # Not one per 2 s slot (that would spread them over 6 s or more): the burst ended after
    # 0.3 s and all four went together, however late a loaded machine let that happen.
    assert released.times[-1] - released.times[0] < 2.0, released.times
    assert released.keys == ["a", "b", "c", "d"]
    assert pacer.may_write("e")  # quiet again: nothing waits


def test_a_forgotten_job_is_never_released() -> None:
    released = Released()
    pacer = WritePacer(released, busy_writes_per_s=100, quiet_s=0.2).start()
    pacer.created()
    pacer.may_write("a")
    assert not pacer.may_write("deleted")
    assert not pacer.may_write("kept")
    pacer.forget("deleted")
    released.wait(1)
    time.sleep(0.3)
    assert released.keys == ["kept"]

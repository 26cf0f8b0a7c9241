"""Status writes held until what they show has stood (runtime/coalesce.py), on a clock of the test's."""

from finetune_operator.decide import Actions
from finetune_operator.reconcile import written_at_once
from finetune_operator.runtime.coalesce import StatusCoalescer
from finetune_operator.status.events import transitions


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_change_waits_until_it_has_stood_for_the_window() -> None:
    clock = Clock()
    held = StatusCoalescer(5.0, clock=clock)
    assert held.hold("j", "Pending") == (True, 5.0)  # a wake-up for when it will have stood
    clock.now += 3
    assert held.hold("j", "Pending") == (True, None)  # the wake-up is queued already
    clock.now += 2
    assert held.hold("j", "Pending") == (False, None)  # stood 5 s: write it
    assert held.held() == 0


def test_a_state_that_moves_on_is_never_written_and_the_wait_starts_again() -> None:
    clock = Clock()
    held = StatusCoalescer(5.0, clock=clock)
    held.hold("j", "Pending")
    clock.now += 4
    assert held.hold("j", "Running") == (True, None)  # the queued wake-up (at 105) comes first
    clock.now += 1
    assert held.hold("j", "Running") == (True, 4.0)  # not stood yet: a new wake-up at 109
    clock.now += 4
    assert held.hold("j", "Running") == (False, None)


def test_a_state_that_never_settles_is_written_after_four_windows() -> None:
    clock = Clock()
    held = StatusCoalescer(5.0, clock=clock)
    for step in range(25):
        verdict, _ = held.hold("j", f"message {step}")
        if not verdict:
            break
        clock.now += 1
    assert clock.now - 100.0 == 20.0


def test_dropped_and_off() -> None:
    clock = Clock()
    held = StatusCoalescer(5.0, clock=clock)
    held.hold("j", "Pending")
    held.drop("j")
    assert held.held() == 0
    assert StatusCoalescer(0.0, clock=clock).hold("j", "Pending") == (False, None)


def test_a_hand_over_waits_the_whole_four_windows_unless_it_moves_on() -> None:
    """The trainer's exit before the Job's verdict: nearly always over before it is written."""
    clock = Clock()
    held = StatusCoalescer(5.0, clock=clock)
    assert held.hold("j", "Running", patient=True) == (True, 20.0)
    clock.now += 19
    assert held.hold("j", "Running", patient=True) == (True, None)
    clock.now += 1
    assert held.hold("j", "Running", patient=True) == (False, None)  # bounded all the same
    held.hold("k", "Finishing", patient=True)
    clock.now += 3
    # What follows a hand-over is an ordinary state again: its own window, with a wake-up of its
    # own (the hand-over's would come 12 s late).
    assert held.hold("k", "Running", patient=False) == (True, 5.0)
    clock.now += 5
    assert held.hold("k", "Running", patient=False) == (False, None)


def test_trouble_and_the_end_are_written_at_once_the_rest_may_wait() -> None:
    """A preemption's count rests on Kueue's Preempted condition, True only until the Workload
    is admitted again: held, it would be lost (the status reconciled after readmission counts
    none). So a change that posts an Event goes at once, like Succeeded and Failed."""
    queued = {"phase": "Queued", "queue": {"preemptions": 0}}
    preempted = {"phase": "Queued", "queue": {"preemptions": 1, "lastPreemption": {"message": "by a higher priority"}}}
    said = tuple(transitions(queued, preempted))
    assert [(t.type, t.reason) for t in said] == [("Warning", "Preempted")]
    assert written_at_once(Actions(status_patch={"queue": preempted["queue"]}, events=said, phase="Queued"))
    assert written_at_once(Actions(status_patch={"phase": "Succeeded"}, phase="Succeeded"))
    assert not written_at_once(Actions(status_patch={"phase": "Running"}, phase="Running"))

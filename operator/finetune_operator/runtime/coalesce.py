"""A job's status writes, coalesced: a change short of the end waits until it has stood.

Under a burst the states a job passes through in seconds (Pending, Running, the moment between
its trainer's exit and its Job's verdict) would each cost a status write. A change that is not
Succeeded or Failed is held until what the user would read has stood unchanged for `window_s`,
and at most `max_factor` times that since the first change not yet written; then the newest
state is written, once. A state the reconciler calls a hand-over (`patient`: the job waits on
the Job controller alone, for a step already decided, status.phase.hand_over) waits the whole
`max_factor` windows: on a quiet control plane it is over long before. Succeeded and Failed
are never held (the reconciler asks only for the others). Level-based like the rest: nothing
here is needed for correctness; a restarted operator starts with nothing held and writes the
first change it finds after its window.

Pure bookkeeping with a clock: the reconciler schedules the wake-up this hands back.
"""

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

# A change is written at the latest this many windows after the first one not yet written, even
# while the state keeps moving (a scheduler message that changes with every pass).
MAX_FACTOR = 4.0


@dataclass
class _Unwritten:
    shown: str  # what the user would read, as the reconciler fingerprints it
    first: float  # when the first unwritten change was seen
    settled: float  # when `shown` last changed
    wake: float = float("-inf")  # when the queued wake-up comes


class StatusCoalescer:
    def __init__(
        self, window_s: float, max_factor: float = MAX_FACTOR, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s
        self.max_s = window_s * max_factor
        self._clock = clock
        self._lock = threading.Lock()
        self._unwritten: dict[Hashable, _Unwritten] = {}

    def hold(self, key: Hashable, shown: str, patient: bool = False) -> tuple[bool, float | None]:
        """(hold the write, seconds until a wake-up must be queued or None when one is queued).
        `patient`: `shown` is a hand-over, to stand `max_s` rather than `window_s`."""
        if self.window_s <= 0:
            return False, None
        with self._lock:
            now = self._clock()
            unwritten = self._unwritten.get(key)
            if unwritten is None:
                unwritten = self._unwritten[key] = _Unwritten(shown, now, now)
            elif unwritten.shown != shown:
                unwritten.shown, unwritten.settled = shown, now
            window = self.max_s if patient else self.window_s
            due = min(unwritten.settled + window, unwritten.first + self.max_s)
            if now >= due:
                del self._unwritten[key]
                return False, None
            # A queued wake-up that comes no later than due will do. (Due moves earlier only when
            # a hand-over moves on to an ordinary state: then an earlier wake-up is queued too.)
            if now < unwritten.wake <= due:
                return True, None
            unwritten.wake = due
            return True, due - now

    def drop(self, key: Hashable) -> None:
        """Nothing unwritten any more (written, nothing to write, or the job is gone)."""
        with self._lock:
            self._unwritten.pop(key, None)

    def held(self) -> int:
        with self._lock:
            return len(self._unwritten)

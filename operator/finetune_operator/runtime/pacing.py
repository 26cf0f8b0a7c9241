"""Status and Event writes yield to Job creation while jobs are being submitted.

Under a burst of submissions the API server is the bottleneck (on the measured 2-core control
plane it used a full core), and what users wait for is their Job. A status patch or an Event
written in the middle of the burst delays every Job created after it. So while the operator is
creating Jobs (one created within the last QUIET_S), a reconcile that would write asks first:
one may go every 1/BUSY_WRITES_PER_S seconds, the others are parked here, in the order they
asked, and handed back to the work queue one per slot. Parked jobs cost nothing while they
wait (no polling); an event for one of them still reconciles it, and it stays parked. As soon
as no Job has been created for QUIET_S, every parked job is released at once and nothing is
paced until the next creation.

Jobs never wait for this: creating a Job is not a paced write. Nothing is released before
`start()`. Status lags only during a burst,
and catches up at the workers' full speed when it ends.
"""

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

# One write every 0.2 s while Jobs are being created: a small share of a burst's requests (each
# job costs even the bare floor two), and a job created alone still gets its status at once.
BUSY_WRITES_PER_S = 5.0
QUIET_S = 1.0


class WritePacer:
    def __init__(
        self,
        release: Callable[[Hashable], None],
        busy_writes_per_s: float = BUSY_WRITES_PER_S,
        quiet_s: float = QUIET_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._release = release
        self._interval = 1.0 / busy_writes_per_s
        self._quiet_s = quiet_s
        self._clock = clock
        self._cond = threading.Condition()
        self._last_creation = float("-inf")
        self._next_write = float("-inf")
        self._parked: OrderedDict[Hashable, None] = OrderedDict()
        self._cleared: set[Hashable] = set()  # released: their next write goes unasked
        self._thread = threading.Thread(target=self._run, name="write-pacer", daemon=True)

    def start(self) -> "WritePacer":
        self._thread.start()
        return self

    def created(self) -> None:
        """A Job was just created: writes are paced for the next QUIET_S."""
        with self._cond:
            self._last_creation = self._clock()

    def creating(self) -> bool:
        """Whether a Job was created within the last QUIET_S."""
        with self._cond:
            return self._clock() - self._last_creation < self._quiet_s

    def may_write(self, key: Hashable) -> bool:
        """True: write now. False: the key is parked and will be handed to `release` later."""
        with self._cond:
            if key in self._cleared:
                self._cleared.discard(key)
                return True
            now = self._clock()
            if now - self._last_creation >= self._quiet_s:
                return True
            if not self._parked and now >= self._next_write:
                self._next_write = now + self._interval
                return True
            if key not in self._parked:
                self._parked[key] = None
                self._cond.notify()
            return False

    def forget(self, key: Hashable) -> None:
        with self._cond:
            self._parked.pop(key, None)
            self._cleared.discard(key)

    def parked(self) -> int:
        with self._cond:
            return len(self._parked)

    def _due(self) -> list[Hashable]:
        """Keys to release now; waits (on the condition) until there are some."""
        with self._cond:
            while True:
                while not self._parked:
                    self._cond.wait()
                now = self._clock()
                quiet_at = self._last_creation + self._quiet_s
                if now >= quiet_at:
                    keys = list(self._parked)
                    self._parked.clear()
                elif now >= self._next_write:
                    keys = [self._parked.popitem(last=False)[0]]
                    self._next_write = now + self._interval
                else:
                    self._cond.wait(min(self._next_write, quiet_at) - now)
                    continue
                self._cleared.update(keys)
                return keys

    def _run(self) -> None:
        while True:
            for key in self._due():
                self._release(key)

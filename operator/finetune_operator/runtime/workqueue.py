"""Jobs waiting to be reconciled: each at most once, the most urgent first, on our own threads.

kopf's event handlers only add a job here and return, so a burst of watch events never ties
up kopf's executor. A job is never reconciled by two threads at once; one added while it is
being reconciled goes round once more afterwards, so the last event is always followed by a
reconcile that started after it (client-go's workqueue has the same contract).

Priorities: a job that has no Job yet (NEW) goes before status work on running jobs (UPDATE).
Under a burst of submissions the first cost users feel is the wait for their Job; progress
and phase patches for jobs already placed can wait a moment.

`add_after` holds a key back for a while (a write that pacing.py postponed): the workers move
it into the queue when it is due, so a waiting key costs no thread. Retries are the queue's too,
as client-go's rate-limited queue has them: `add_rate_limited` adds a key again after a delay
that doubles with each failure in a row (RETRY_FIRST_S to RETRY_MAX_S), `forget` ends the row.

Nothing runs until `start()`: building a queue starts no thread.
"""

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable

logger = logging.getLogger(__name__)

NEW = 0
UPDATE = 1
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0


class WorkQueue:
    def __init__(
        self,
        work: Callable[[Hashable], None],
        workers: int,
        name: str = "reconcile",
        retry_first_s: float = RETRY_FIRST_S,
        retry_max_s: float = RETRY_MAX_S,
    ) -> None:
        self._work = work
        self._retry_first_s = retry_first_s
        self._retry_max_s = retry_max_s
        self._failures: dict[Hashable, int] = {}
        self._retrying: set[Hashable] = set()  # a retry is waiting in _later
        self._cond = threading.Condition()
        self._heap: list[tuple[int, int, Hashable]] = []
        self._queued: dict[Hashable, int] = {}  # key -> priority it is queued at
        self._active: set[Hashable] = set()
        self._again: dict[Hashable, int] = {}  # added while active: queued when it finishes
        self._later: list[tuple[float, int, Hashable, int]] = []  # (due, order, key, priority)
        self._order = itertools.count()
        self._stopped = False
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(workers)]

    def start(self) -> "WorkQueue":
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float) -> bool:
        """Hand out no more work; wait up to `timeout` for the work under way. True if it ended."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            while self._active:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def add(self, key: Hashable, priority: int = UPDATE) -> None:
        with self._cond:
            if key in self._active:
                self._again[key] = min(priority, self._again.get(key, priority))
                return
            self._push(key, priority)

    def add_after(self, key: Hashable, delay: float, priority: int = UPDATE) -> None:
        """Add the key once `delay` seconds have passed."""
        with self._cond:
            heapq.heappush(self._later, (time.monotonic() + delay, next(self._order), key, priority))
            self._cond.notify()

    def add_rate_limited(self, key: Hashable, priority: int = UPDATE) -> tuple[int, float]:
        """Add the key again after its backoff; (failures in a row, delay). While one retry
        waits, further failures only lengthen the row: the waiting retry is the next run."""
        with self._cond:
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
            delay = min(self._retry_max_s, self._retry_first_s * 2 ** (failures - 1))
            if key not in self._retrying:
                self._retrying.add(key)
                heapq.heappush(self._later, (time.monotonic() + delay, next(self._order), key, priority))
                self._cond.notify()
        return failures, delay

    def forget(self, key: Hashable) -> None:
        """The key's work succeeded (or the key is gone): its next failure starts a new row."""
        with self._cond:
            self._failures.pop(key, None)

    def _push(self, key: Hashable, priority: int) -> None:
        held = self._queued.get(key)
        if held is not None and held <= priority:
            return
        # A better priority adds a second entry; the first is skipped when it comes up.
        self._queued[key] = priority
        heapq.heappush(self._heap, (priority, next(self._order), key))
        self._cond.notify()

    def depth(self) -> int:
        with self._cond:
            return len(self._queued)

    def _take(self) -> Hashable:
        with self._cond:
            while True:
                while self._stopped:
                    self._cond.wait()
                self._move_due()
                if not self._heap:
                    self._cond.wait(self._later[0][0] - time.monotonic() if self._later else None)
                    continue
                priority, _, key = heapq.heappop(self._heap)
                if self._queued.get(key) == priority:
                    del self._queued[key]
                    self._active.add(key)
                    # Whatever retry was due, this run is it.
                    self._retrying.discard(key)
                    return key

    def _move_due(self) -> None:
        now = time.monotonic()
        while self._later and self._later[0][0] <= now:
            _, _, key, priority = heapq.heappop(self._later)
            if key in self._active:
                self._again[key] = min(priority, self._again.get(key, priority))
            else:
                self._push(key, priority)

    def _run(self) -> None:
        while True:
            key = self._take()
            try:
                self._work(key)
            except Exception:
                # A bug, not an API error (those are retried inside the work): logged in full,
                # and the worker lives on for the other jobs.
                logger.exception("reconcile of %s failed", key)
            finally:
                with self._cond:
                    self._active.discard(key)
                    again = self._again.pop(key, None)
                    if again is not None:
                        self._push(key, again)
                    if self._stopped:
                        self._cond.notify_all()

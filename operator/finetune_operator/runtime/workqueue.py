"""Jobs waiting to be reconciled: each at most once, the most urgent first, on our own threads.

kopf's event handlers only add a job here and return, so a burst of watch events never ties
up kopf's executor. A job is never reconciled by two threads at once; one added while it is
being reconciled goes round once more afterwards, so the last event is always followed by a
reconcile that started after it (client-go's workqueue has the same contract).

Priorities: a job that has no Job yet (NEW) goes before status work on running jobs (UPDATE).
Under a burst of submissions the first cost users feel is the wait for their Job; progress
and phase patches for jobs already placed can wait a moment.

`add_after` holds a key back for a while (a write that pacing.py postponed, a retry after an
API error): the workers move it into the queue when it is due, so a waiting key costs no thread.
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


class WorkQueue:
    def __init__(self, work: Callable[[Hashable], None], workers: int, name: str = "reconcile") -> None:
        self._work = work
        self._cond = threading.Condition()
        self._heap: list[tuple[int, int, Hashable]] = []
        self._queued: dict[Hashable, int] = {}  # key -> priority it is queued at
        self._active: set[Hashable] = set()
        self._again: dict[Hashable, int] = {}  # added while active: queued when it finishes
        self._later: list[tuple[float, int, Hashable, int]] = []  # (due, order, key, priority)
        self._order = itertools.count()
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for thread in self._threads:
            thread.start()

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
                self._move_due()
                while not self._heap:
                    self._cond.wait(self._later[0][0] - time.monotonic() if self._later else None)
                    self._move_due()
                priority, _, key = heapq.heappop(self._heap)
                if self._queued.get(key) == priority:
                    del self._queued[key]
                    self._active.add(key)
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

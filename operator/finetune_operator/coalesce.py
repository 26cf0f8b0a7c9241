"""Collapse bursts of triggers for one job into as few reconciles as correctness allows.

A job's pod and Job emit several watch events within a second; each used to queue a full
reconcile behind the job's lock, holding a worker thread while it waited. Now a trigger that
arrives while the job is being reconciled only marks it dirty, and the running reconcile goes
round once more when it finishes. The last trigger is always followed by a reconcile that
started after it, so nothing is missed.
"""

import threading
from collections.abc import Callable, Hashable


class Coalescer:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._running: set[Hashable] = set()
        self._dirty: set[Hashable] = set()

    def run(self, key: Hashable, work: Callable[[], object]) -> bool:
        """Run `work` for `key` now, or leave it to the run in progress; True if it ran here."""
        with self._guard:
            if key in self._running:
                self._dirty.add(key)
                return False
            self._running.add(key)
        try:
            while True:
                work()
                with self._guard:
                    if key not in self._dirty:
                        return True
                    self._dirty.discard(key)
        finally:
            with self._guard:
                self._running.discard(key)
                self._dirty.discard(key)

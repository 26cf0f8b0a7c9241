"""The trainer identity of each namespace (builders/rbac.py), made on the namespace's first job.

Checked again at most every REFRESH_S per namespace, so an identity someone deleted comes back
without every new job paying for the check. Creating is idempotent (create, or get on 409): two
workers that race on a namespace's first two jobs both succeed, an operator restart re-checks.
"""

import threading
import time
from collections.abc import Callable

from .builders import rbac
from .kube import Body

REFRESH_S = 300.0

CreateOne = Callable[[Body], object]


class TrainerIdentities:
    def __init__(self, create: CreateOne, refresh_s: float = REFRESH_S) -> None:
        self._create = create
        self._refresh_s = refresh_s
        self._guard = threading.Lock()
        self._checked: dict[str, float] = {}

    def ensure(self, namespace: str) -> None:
        """The namespace's ServiceAccount, Role and RoleBinding exist (raises on API errors)."""
        with self._guard:
            checked = self._checked.get(namespace)
        if checked is not None and time.monotonic() - checked < self._refresh_s:
            return
        for child in rbac.identity(namespace):
            self._create(child)
        with self._guard:
            self._checked[namespace] = time.monotonic()

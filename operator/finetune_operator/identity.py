"""What the jobs of a namespace share, made on the namespace's first job: the trainer identity
(builders/rbac.py) and the trainers' NetworkPolicies (builders/network.py), as
`decide.namespace_children` lists them.

Checked again at most every REFRESH_S per namespace, so an identity someone deleted comes back
without every new job paying for the check. Creating is idempotent (create, or get on 409), so
an operator restart simply re-checks.

One check per namespace at a time: the jobs of a burst that arrive while the first one makes
the identity wait for it instead of each sending the same three creates (measured: the first
fifteen jobs of a 500-job burst waited up to 2.1 s for their Job behind those duplicate calls).
"""

import threading
import time
from collections.abc import Callable

from .builders import rbac
from .kube import Body

REFRESH_S = 300.0

CreateOne = Callable[[Body], object]
Children = Callable[[str], list[Body]]


class TrainerIdentities:
    def __init__(self, create: CreateOne, refresh_s: float = REFRESH_S, children: Children = rbac.identity) -> None:
        self._create = create
        self._children = children
        self._refresh_s = refresh_s
        self._guard = threading.Lock()
        self._checked: dict[str, float] = {}
        self._making: dict[str, threading.Lock] = {}

    def _fresh(self, namespace: str) -> bool:
        with self._guard:
            checked = self._checked.get(namespace)
        return checked is not None and time.monotonic() - checked < self._refresh_s

    def ensure(self, namespace: str) -> None:
        """The namespace's ServiceAccount, Role and RoleBinding (and trainer NetworkPolicies)
        exist (raises on API errors)."""
        if self._fresh(namespace):
            return
        with self._guard:
            making = self._making.setdefault(namespace, threading.Lock())
        with making:
            # Whoever held the lock before may have made it meanwhile; if it failed, try again.
            if self._fresh(namespace):
                return
            for child in self._children(namespace):
                self._create(child)
            with self._guard:
                self._checked[namespace] = time.monotonic()

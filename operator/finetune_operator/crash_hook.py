"""A test-only fault: exit hard right after creating one kind of child.

Acceptance test "operator killed mid-reconcile" sets FINETUNE_TEST_CRASH_AFTER=PersistentVolumeClaim
(between a job's output claim and its Job); the next operator must then finish the job with
exactly one of each child. Off unless set.
"""

import logging
import os

from .settings import Settings

CRASH_EXIT_CODE = 86
logger = logging.getLogger(__name__)


def maybe_crash(settings: Settings, kind: str) -> None:
    if settings.crash_after and settings.crash_after == kind:
        logger.warning("test hook: exiting after creating a %s", kind)
        logging.shutdown()
        os._exit(CRASH_EXIT_CODE)

"""Log levels that say what a line means to whoever reads the operator's log.

kopf logs every retried API request at ERROR ("Request attempt #1/9 failed; will retry: ...
429 Too Many Requests"), so a start-up throttle read as a failure in log pipelines that alert on
`severity: error`. A retry is a warning; only the request that gives up ("escalating") is an
error, and kopf still logs that one at ERROR.
"""

import logging

RETRIED = "failed; will retry"


class RetriesAreWarnings(logging.Filter):
    """Lowers kopf's retried-request records from ERROR to WARNING (a handler filter: kopf logs
    them on loggers it passes around, so no one logger's filter sees them all)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("kopf") and record.levelno == logging.ERROR and RETRIED in record.getMessage():
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        return True


def install(root: logging.Logger | None = None) -> None:
    """On every handler of the root logger (kopf.configure has put its own there)."""
    for handler in (root or logging.getLogger()).handlers:
        if not any(isinstance(f, RetriesAreWarnings) for f in handler.filters):
            handler.addFilter(RetriesAreWarnings())

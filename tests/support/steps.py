"""Set-up steps that happen inside the test run (the cluster's start with its binaries, the llama.cpp
builds) report their time here, so `make test` can print every step's time (tests/run.py).

They are appended as JSON lines to the file named by FINETUNE_TEST_STEPS (set by tests/run.py);
a plain `pytest` run without it records nothing.
"""

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

STEPS_ENV = "FINETUNE_TEST_STEPS"


@contextlib.contextmanager
def timed(name: str) -> Iterator[None]:
    started = time.monotonic()
    yield
    record(name, time.monotonic() - started)


def record(name: str, seconds: float) -> None:
    path = os.environ.get(STEPS_ENV)
    if not path:
        return
    line = json.dumps({"step": name, "seconds": round(seconds, 1), "pid": os.getpid()})
    # One short write with O_APPEND: lines from parallel workers do not interleave.
    with Path(path).open("a", encoding="utf-8") as out:
        out.write(line + "\n")

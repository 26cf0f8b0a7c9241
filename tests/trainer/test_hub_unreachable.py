"""A Hub source whose Hub cannot be reached ends the run in seconds with one line naming the field,
not after the Hub library's retries with its several sentences (it took 29 s)."""

import time

import pytest

from finetune_api.reasons import ExitReason
from tests.support.harness import free_port
from tests.trainer.conftest import JobDir

pytestmark = pytest.mark.trainer


def test_an_unreachable_hub_is_said_in_one_line_within_seconds(job_dir: JobDir) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    job_dir.spec_changes = {"model": {"source": {"pvc": None, "hub": {"id": "org/tiny"}}}}
    started = time.monotonic()
    run = job_dir.run(env={"HF_ENDPOINT": closed, "HF_HUB_OFFLINE": "0"})
    seconds = time.monotonic() - started
    assert run.code == ExitReason.InvalidConfig
    assert (
        run.termination == f"InvalidConfig: spec.model.source.hub: cannot reach the Hub at {closed}: Connection refused"
    )
    assert seconds < 30, f"{seconds:.1f} s to say the Hub cannot be reached"

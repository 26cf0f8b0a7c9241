"""What the operator's log says at which level: kopf's JSON lines, as a log pipeline reads them."""

import json
import logging

import kopf
import pytest

from finetune_operator import log_levels


def _lines(err: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def test_a_retried_request_is_a_warning_and_one_that_gives_up_stays_an_error(capfd: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = list(root.handlers)
    try:
        kopf.configure(log_format=kopf.LogFormat.JSON)
        log_levels.install()
        log_levels.install()  # idempotent: one filter per handler
        assert {sum(isinstance(f, log_levels.RetriesAreWarnings) for f in h.filters) for h in root.handlers} == {1}
        api = logging.getLogger("kopf._cogs.clients.api")
        url = "GET https://127.0.0.1:6443/apis/finetune.dev/v1alpha1/finetunejobs"
        api.error(f"Request attempt #1/9 failed; will retry: {url} -> APITooManyRequestsError(429)")
        api.error(f"Request attempt #9/9 failed; escalating: {url} -> APITooManyRequestsError(429)")
        logging.getLogger("finetune_operator.reconcile").error("not kopf: failed; will retry")
        lines = _lines(capfd.readouterr().err)
    finally:
        for handler in root.handlers:
            handler.filters[:] = [f for f in handler.filters if not isinstance(f, log_levels.RetriesAreWarnings)]
        root.handlers[:] = saved
    assert [line["severity"] for line in lines] == ["warn", "error", "error"], lines

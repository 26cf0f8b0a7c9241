"""The Hub-token scan's error handling, without a cluster: a kind the API server could not list
is skipped only for a reason it names (tests/security/test_security.py's `why_unlistable`);
any other error fails the scan instead of hiding the kind it could not read."""

import pytest
from kubernetes.client.exceptions import ApiException

from tests.security.test_security import why_unlistable


@pytest.mark.parametrize("status", [404, 405, 503])
def test_known_answers_are_named(status: int) -> None:
    assert why_unlistable(ApiException(status=status, reason="x"))


@pytest.mark.parametrize(
    "error",
    [ApiException(status=403, reason="Forbidden"), ApiException(status=500, reason="x"), ValueError("bad body")],
    ids=["forbidden", "server error", "not an API answer"],
)
def test_any_other_error_fails_the_scan(error: Exception) -> None:
    with pytest.raises(type(error)):
        why_unlistable(error)

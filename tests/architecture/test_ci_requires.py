"""Under CI=true a missing tool that CI installs fails its test; elsewhere it skips
(tests/support/ci.py). Planted here: the tool is absent, with CI set and unset."""

import pytest

from tests.support.ci import require


def test_a_missing_tool_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="kubectl-finetune is missing, and CI installs it"):
        require(False, "kubectl-finetune")


def test_a_missing_tool_skips_on_a_developer_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        require(False, "kubectl")


def test_a_present_tool_neither_fails_nor_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    require(True, "kubectl")

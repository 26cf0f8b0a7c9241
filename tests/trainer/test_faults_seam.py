"""The trainer's one fault seam (finetune_trainer/faults.py): without `FINETUNE_FAULTS` every hook
does nothing; with it, the named module's `faults()` is installed, and a trainer process started
anywhere finds the tests' module through the environment tests/support/faults.py gives it."""

import inspect
import subprocess
import sys
import types
from pathlib import Path

import pytest

from finetune_trainer import faults
from tests.support.faults import faults_env
from tests.support.trainer_faults import NONFINITE_AT, TestFaults


@pytest.fixture(autouse=True)
def _no_hooks_left() -> object:
    yield
    faults.install({})


def _call_every_hook(hooks: faults.Faults) -> dict[str, object]:
    """Each hook called once with plain arguments, what it returned by name."""
    arguments = {
        "step": 3,
        "micro": 1,
        "tightened": False,
        "name": "merged",
        "chunk": 4096,
        "model": object(),
        "url": "http://judge:8080/score",
    }
    returned = {}
    for name, method in inspect.getmembers(hooks, inspect.ismethod):
        if name.startswith("_"):
            continue
        params = inspect.signature(method).parameters
        returned[name] = method(**{p: arguments[p] for p in params})
    return returned


def test_without_the_variable_every_hook_is_a_no_op() -> None:
    hooks = faults.install({})
    assert type(hooks) is faults.Faults and faults.current() is hooks
    returned = _call_every_hook(hooks)
    assert returned.pop("nonfinite_at") is False
    assert returned.pop("fetch_chunk") == 4096
    assert returned.pop("reward_url") == "http://judge:8080/score"
    assert set(returned.values()) == {None}
    assert len(returned) >= 6


def test_the_variable_installs_the_module_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NONFINITE_AT, "3")
    hooks = faults.install({faults.FAULTS_ENV: "tests.support.trainer_faults"})
    assert isinstance(hooks, TestFaults) and faults.current() is hooks
    assert hooks.nonfinite_at(3) and not hooks.nonfinite_at(4)


def test_a_module_whose_faults_are_not_faults_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = types.ModuleType("wrong_faults")
    wrong.faults = object  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wrong_faults", wrong)
    with pytest.raises(TypeError, match="FINETUNE_FAULTS=wrong_faults: faults\\(\\) returned object"):
        faults.install({faults.FAULTS_ENV: "wrong_faults"})


def test_a_trainer_process_started_elsewhere_finds_the_tests_faults(tmp_path: Path) -> None:
    code = "from finetune_trainer import faults; print(type(faults.install()).__name__)"
    env = {"PATH": "/usr/bin:/bin", **faults_env(FINETUNE_TEST_OOM_AT="2")}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "TestFaults", done.stderr


def test_a_switch_the_faults_do_not_read_is_a_mistake_said_at_once() -> None:
    with pytest.raises(AssertionError, match="FINETUNE_TEST_NO_SUCH"):
        faults_env(FINETUNE_TEST_NO_SUCH="1")

"""Shared pytest wiring. Fixture modules live in tests/fixtures/ and register here; the tiers
(`fast`, `cluster`, `tools`, `trainer`, `llama_cpp`, `gpu`, `soak`) are given in
tests/support/tiers.py."""

import shlex
import sys
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from tests.support import tiers

# The cluster's fixtures need the Kubernetes client; a GPU machine running `make test-gpu` has the
# trainer's packages only, and collects no test that uses them.
pytest_plugins: list[str] = ["tests.fixtures.tools"]
if find_spec("kubernetes"):
    pytest_plugins += ["tests.fixtures.cluster", "tests.fixtures.kueue", "tests.fixtures.object_store"]

# Run last: it installs and uninstalls a whole release of the chart on the shared control plane.
# Seen in the full suite: after it, the tests' own NetworkPolicy fence (another binding of the
# same policy file) admitted every broader NetworkPolicy, while it refuses them before it; the
# cause is not yet found, so the release test goes last and the fence cases stay strict.
LAST = ("tests/chart/test_install.py",)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A module none of whose tests the `-m` expression can select is not imported at all."""
    test_module = collection_path.suffix == ".py" and collection_path.name.startswith("test_")
    if test_module and tiers.skippable(config.option.markexpr or "", collection_path):
        return True
    return None


# Before pytest-xdist's own hook, which reads the `xdist_group` marks set here.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marked = {mark.name for mark in item.iter_markers()}
        for tier in tiers.tiers_of(marked, list(getattr(item, "fixturenames", ())), item.path) - marked:
            item.add_marker(tier)
        if _shares_module_state(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if any(item.get_closest_marker("gpu") for item in items) and not _cuda():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)
    items.sort(key=lambda item: item.nodeid.startswith(LAST))


def _shares_module_state(item: pytest.Item) -> bool:
    """A test that uses a module- or class-scoped fixture (a trained run the module's tests all
    read) runs on the worker that built it: `--dist loadgroup` keeps such tests together, and
    sends every other test to whichever worker is free (tests/run.py)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope in ("module", "class", "package") for defs in info.name2fixturedefs.values() for d in defs)


def _cuda() -> bool:
    import torch  # only when a GPU test is collected: its module has imported torch already

    return bool(torch.cuda.is_available())


def pytest_collection_finish(session: pytest.Session) -> None:
    """A run that selects no trainer-tier test promises not to load torch: hold it to that."""
    if tiers.excludes_trainer(session.config.option.markexpr or "") and "torch" in sys.modules:
        raise pytest.UsageError(
            "tiers: torch was imported while collecting a run that selects no trainer-tier test; "
            "a module that tests/support/tiers.py reads as light loads it"
        )


_TORCH_BEFORE = pytest.StashKey[bool]()


class _FastTestBinaries:
    """The fast tier's other promise, no build: while a fast test runs (its fixtures too), a
    process that would start a binary built from source, or a compiler that builds one, is
    refused by an audit hook (so no build starts) and the test errors naming it."""

    def __init__(self) -> None:
        self.test: str | None = None
        self.refused: list[str] = []

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if self.test is None or event not in ("subprocess.Popen", "os.system", "os.posix_spawn", "os.exec"):
            return
        if event == "os.system":
            found = tiers.built_binary(None, shlex.split(args[0]))
        else:
            found = tiers.built_binary(args[0], args[1], args[3] if event == "subprocess.Popen" else args[2])
        if found is not None:
            self.refused.append(found)
            raise RuntimeError(self.said(self.test, found))

    @staticmethod
    def said(test: str, found: str) -> str:
        fixtures = ", ".join(tiers.TOOL_FIXTURES)
        return (
            f"tiers: the fast test {test} started {found}: a fast test runs no binary built from source "
            f"and starts no build of one; a test that needs one uses its fixture ({fixtures}; "
            "tests/fixtures/tools.py) or `cluster`, which puts it in a tier of its own"
        )


_BINARIES = _FastTestBinaries()
sys.addaudithook(_BINARIES.audit)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_TORCH_BEFORE] = "torch" in sys.modules
    _BINARIES.test, _BINARIES.refused = (item.nodeid if item.get_closest_marker("fast") else None), []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A refusal the test let through has failed it already, naming it: not said twice."""
    outcome = yield
    if call.when == "call" and outcome.get_result().failed:
        _BINARIES.refused = []


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """The fast tier's promises, test by test: the test that started a built binary and caught
    the refusal, or that imported torch, errors, named."""
    refused, _BINARIES.test = _BINARIES.refused, None
    if refused:
        pytest.fail(_BINARIES.said(item.nodeid, refused[0]), pytrace=False)
    if item.stash.get(_TORCH_BEFORE, True) or "torch" not in sys.modules:
        return
    if tiers.excludes_trainer(item.config.option.markexpr or ""):
        pytest.fail(
            "tiers: this test imported torch in a run that selects no trainer-tier test "
            "(mark it `trainer`, or import torch lazily where the product can)",
            pytrace=False,
        )


@pytest.fixture(autouse=True)
def _fast_tests_reach_no_cluster(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ftjob plan` judges a job against the cluster a kubeconfig reaches; a fast test's plan is
    the planner's own on any machine, so it is never handed the KUBECONFIG a cluster test set for
    the session on the same worker (a path with no file there: no cluster is read)."""
    if request.node.get_closest_marker("fast") is not None:
        monkeypatch.setenv("KUBECONFIG", str(Path(__file__).parent / "no-cluster-for-fast-tests"))

"""Shared pytest wiring. Fixture modules live in tests/fixtures/ and register here; the tiers
(`fast`, `cluster`, `trainer`, `llama_cpp`, `gpu`, `soak`) are given in tests/support/tiers.py."""

import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.support import tiers

# The cluster's fixtures need the Kubernetes client; a GPU machine running `make test-gpu` has the
# trainer's packages only, and collects no test that uses them.
pytest_plugins: list[str] = ["tests.fixtures.cluster", "tests.fixtures.kueue"] if find_spec("kubernetes") else []

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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_TORCH_BEFORE] = "torch" in sys.modules


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """The same promise, test by test: the test that imports torch errors, named."""
    if item.stash.get(_TORCH_BEFORE, True) or "torch" not in sys.modules:
        return
    if tiers.excludes_trainer(item.config.option.markexpr or ""):
        pytest.fail(
            "tiers: this test imported torch in a run that selects no trainer-tier test "
            "(mark it `trainer`, or import torch lazily where the product can)",
            pytrace=False,
        )

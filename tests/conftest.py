"""Shared pytest wiring. Fixture modules live in tests/fixtures/ and register here."""

from importlib.util import find_spec

import pytest

# The cluster's fixtures need the Kubernetes client; a GPU machine running `make test-gpu` has the
# trainer's packages only, and collects no test that uses them.
pytest_plugins: list[str] = ["tests.fixtures.cluster", "tests.fixtures.kueue"] if find_spec("kubernetes") else []

# Run last: it installs and uninstalls a whole release of the chart on the shared control plane.
# Seen in the full suite: after it, the tests' own NetworkPolicy fence (another binding of the
# same policy file) admitted every broader NetworkPolicy, while it refuses them before it; the
# cause is not yet found, so the release test goes last and the fence cases stay strict.
LAST = ("tests/chart/test_install.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.nodeid.startswith(LAST))

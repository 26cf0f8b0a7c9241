"""Soak tests run only when asked for (`make soak` = `pytest -m soak tests/reliability`)."""

import pytest
from kubernetes import client

from tests.support.install import finetune_crd_install


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "soak" in (config.option.markexpr or ""):
        return
    kept = [item for item in items if item.get_closest_marker("soak") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


@pytest.fixture(scope="session")
def finetune_crd(kube: client.ApiClient) -> str:
    return finetune_crd_install(kube)


@pytest.fixture(autouse=True)
def _crd_for_cluster_tests(request: pytest.FixtureRequest) -> None:
    """Scenarios on the shared control plane need the FineTuneJob CRD installed (once)."""
    if request.node.get_closest_marker("cluster") is not None and "own_cluster" not in request.fixturenames:
        request.getfixturevalue("finetune_crd")

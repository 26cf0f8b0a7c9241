"""The security tests run on the shared control plane with the FineTuneJob CRD installed."""

import pytest
from kubernetes import client

from tests.support.install import finetune_crd_install


@pytest.fixture(scope="session", autouse=True)
def finetune_crd(kube: client.ApiClient) -> str:
    return finetune_crd_install(kube)

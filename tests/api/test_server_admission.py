"""The API server refuses the ModelServers `ftjob validate` refuses (tests/support/server_cases.py),
each naming the field, from the CRD's schema and CEL rules generated from the same models; and
stores a valid one with its defaults."""

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from finetune_api.constants import GROUP, SERVER_PLURAL, VERSION
from tests.support.install import finetune_crd_install
from tests.support.server_cases import SERVER, WRONG_SERVERS, server_with

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def crds(kube: client.ApiClient) -> str:
    return finetune_crd_install(kube)


def _create(custom: client.CustomObjectsApi, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    made: dict[str, Any] = custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, SERVER_PLURAL, body, field_validation="Strict"
    )
    return made


@pytest.mark.parametrize(("case", "change", "meta", "_", "field"), WRONG_SERVERS, ids=[c[0] for c in WRONG_SERVERS])
def test_admission_refuses_each_wrong_server(
    crds: str, custom: client.CustomObjectsApi, namespace: str, case: str, change: Any, meta: Any, _: str, field: str
) -> None:
    with pytest.raises(ApiException) as failure:
        _create(custom, namespace, server_with(change, meta))
    message = json.loads(failure.value.body)["message"]
    assert field in message, message


def test_a_valid_server_is_stored_with_its_defaults(crds: str, custom: client.CustomObjectsApi, namespace: str) -> None:
    body = server_with({"resources": None, "contextSize": None, "parallel": None})
    made = _create(custom, namespace, body)
    spec = made["spec"]
    assert spec["resources"] == {"gpus": 1, "gpuProduct": "Tesla-P40"}
    assert (spec["replicas"], spec["contextSize"], spec["parallel"]) == (1, 4096, 4)
    assert spec["adapters"] == SERVER["spec"]["adapters"]

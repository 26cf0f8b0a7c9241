"""Kueue on the local control plane (hack/cluster/kueue.py): its webhooks reach the manager through
the ExternalName Service, only those of batch/v1 Jobs and Kueue's own kinds are registered, and
it manages a Job that names a LocalQueue."""

import base64
from typing import Any

import pytest
from kubernetes import client

from hack.cluster import kueue as local_kueue
from tests.fixtures.cluster import wait_for
from tests.support.specs import gpu_job

pytestmark = pytest.mark.cluster


def _configurations(api: client.ApiClient) -> list[Any]:
    admission = client.AdmissionregistrationV1Api(api)
    return [
        admission.read_mutating_webhook_configuration(local_kueue.MUTATING),
        admission.read_validating_webhook_configuration(local_kueue.VALIDATING),
    ]


def test_only_job_and_kueue_webhooks_are_registered_and_all_carry_kueues_ca(
    kueue: local_kueue.KueuePaths, kube: client.ApiClient
) -> None:
    ca = (kueue.certs / "ca.crt").read_bytes()
    for configuration in _configurations(kube):
        assert configuration.webhooks
        for webhook in configuration.webhooks:
            groups = {g for rule in webhook.rules for g in rule.api_groups}
            assert groups <= local_kueue.WEBHOOK_GROUPS, (webhook.name, groups)
            service = webhook.client_config.service
            assert (service.namespace, service.name) == (local_kueue.NAMESPACE, local_kueue.WEBHOOK_SERVICE)
            assert webhook.client_config.ca_bundle, webhook.name
            assert ca.strip() in base64.b64decode(webhook.client_config.ca_bundle)


def test_kueue_suspends_a_queued_job_through_its_webhook_and_makes_its_workload(
    kueue: local_kueue.KueuePaths, kube: client.ApiClient, batch: client.BatchV1Api, namespace: str
) -> None:
    body = gpu_job("queued", 1)
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "nowhere"}
    created = batch.create_namespaced_job(namespace, body)
    # Created unsuspended: Kueue's mutating webhook (via 127.0.0.1) suspends it on admission.
    assert created.spec.suspend is True
    custom = client.CustomObjectsApi(kube)

    def workload() -> dict[str, Any] | None:
        items = custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", namespace, "workloads")["items"]
        return items[0] if items and items[0].get("status", {}).get("conditions") else None

    found = wait_for(workload, 60, "Kueue's Workload of the Job")
    reserved = next(c for c in found["status"]["conditions"] if c["type"] == "QuotaReserved")
    assert reserved["status"] == "False" and "nowhere" in reserved["message"], reserved
    assert batch.read_namespaced_job("queued", namespace).spec.suspend is True

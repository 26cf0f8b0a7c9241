"""The API server really enforces what operators depend on: CEL rules, RBAC, Pod Security admission."""

import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.fixtures.cluster import Cluster, token_client, wait_for

pytestmark = pytest.mark.cluster


def _widget_crd(group: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "replicas": {"type": "integer"},
                                        "maxReplicas": {"type": "integer"},
                                    },
                                    "x-kubernetes-validations": [
                                        {"rule": "self.replicas <= self.maxReplicas", "message": "replicas above max"}
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


def test_crd_cel_rule_rejects_a_bad_object(
    apiext: client.ApiextensionsV1Api, custom: client.CustomObjectsApi, namespace: str
) -> None:
    group = f"g{uuid.uuid4().hex[:8]}.test.finetune.dev"
    apiext.create_custom_resource_definition(_widget_crd(group))
    try:

        def established() -> bool:
            crd = apiext.read_custom_resource_definition(f"widgets.{group}")
            return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

        wait_for(established, 30, "the CRD to be established")

        def create(replicas: int) -> Any:
            body = {
                "apiVersion": f"{group}/v1",
                "kind": "Widget",
                "metadata": {"name": f"w{replicas}"},
                "spec": {"replicas": replicas, "maxReplicas": 3},
            }
            return custom.create_namespaced_custom_object(group, "v1", namespace, "widgets", body)

        # A freshly established CRD may 404 for a moment until its handler is installed.
        wait_for(lambda: _created(lambda: create(2)), 30, "a valid widget to be accepted")
        with pytest.raises(ApiException) as rejected:
            create(5)
        assert rejected.value.status == 422
        assert "replicas above max" in rejected.value.body
    finally:
        apiext.delete_custom_resource_definition(f"widgets.{group}")


def _created(create: Any) -> bool:
    try:
        create()
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


def test_a_narrow_role_forbids_what_it_does_not_grant(
    cluster: Cluster, core: client.CoreV1Api, rbac: client.RbacAuthorizationV1Api, namespace: str
) -> None:
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "configmap-reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmap-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    as_reader = client.CoreV1Api(token_client(cluster, core, namespace, "reader"))
    # RBAC caches settle fast but not instantly after the binding is created.
    wait_for(lambda: as_reader.list_namespaced_config_map(namespace) is not None, 10, "the granted list to work")

    for forbidden in (
        lambda: as_reader.list_namespaced_secret(namespace),
        lambda: as_reader.create_namespaced_config_map(namespace, {"metadata": {"name": "nope"}}),
        lambda: as_reader.list_namespaced_config_map("default"),
    ):
        with pytest.raises(ApiException) as denied:
            forbidden()
        assert denied.value.status == 403


def _root_pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "busybox", "command": ["true"], "securityContext": {"runAsUser": 0}}
            ],
        },
    }


def test_restricted_namespace_rejects_a_root_pod(core: client.CoreV1Api, namespace: str) -> None:
    # Without the label the same pod is admitted: what rejects it below is the policy, not the pod.
    core.create_namespaced_pod(namespace, _root_pod("allowed"))
    core.patch_namespace(namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})

    # Pod Security admission reads namespace labels from an informer: the new label reaches it a
    # moment after the patch (under load, one create slipped through in between).
    def refusal() -> ApiException | None:
        try:
            core.create_namespaced_pod(namespace, _root_pod("root"))
        except ApiException as exc:
            return exc
        core.delete_namespaced_pod("root", namespace, grace_period_seconds=0)
        wait_for(lambda: not _exists(core, namespace, "root"), 30, "the admitted pod to go")
        return None

    rejected = wait_for(refusal, 30, "Pod Security to refuse a root pod")
    assert rejected.status == 403
    assert "violates PodSecurity" in rejected.body
    assert "restricted:latest" in rejected.body


def _exists(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True

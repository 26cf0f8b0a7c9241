"""What the operator's tests install on the control plane: the CRD as the models generate it, the
chart's admission policies, claims."""

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from finetune_api import crd as crd_model
from finetune_api import server_crd
from finetune_api.constants import CRD_NAME, SERVER_CRD_NAME
from tests.support.harness import (
    SYSTEM_NAMESPACE,
    operator_fence_policies,
    trainer_rules_policy,
    trainer_status_policy,
    wait_for,
)


def admission_policies_install(kube: client.ApiClient, objects: list[dict[str, Any]]) -> None:
    """Create or update ValidatingAdmissionPolicies and their bindings, in the order given."""
    admission = client.AdmissionregistrationV1Api(kube)
    calls = {
        "ValidatingAdmissionPolicy": (
            admission.create_validating_admission_policy,
            admission.read_validating_admission_policy,
            admission.replace_validating_admission_policy,
        ),
        "ValidatingAdmissionPolicyBinding": (
            admission.create_validating_admission_policy_binding,
            admission.read_validating_admission_policy_binding,
            admission.replace_validating_admission_policy_binding,
        ),
    }
    for body in objects:
        create, read, replace = calls[body["kind"]]
        try:
            create(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            _replace_latest(body, read, replace)


def _replace_latest(body: dict[str, Any], read: Any, replace: Any) -> None:
    """Replace at the latest version; parallel test workers install the same objects at their
    start, so a replace that loses to another's write (409) reads again and retries."""
    name = body["metadata"]["name"]
    for attempt in range(10):
        version = read(name).metadata.resource_version
        try:
            replace(name, {**body, "metadata": {**body["metadata"], "resourceVersion": version}})
            return
        except ApiException as exc:
            if exc.status != 409 or attempt == 9:
                raise


def trainer_status_policy_install(kube: client.ApiClient) -> None:
    """The chart's admission policy that keeps each trainer to its own job."""
    admission_policies_install(kube, trainer_status_policy())


def operator_fence_install(kube: client.ApiClient) -> None:
    """The chart's fence around the operator's own token, for the tests' operator account: every
    test that runs the operator runs it inside the fence, as the chart installs it, with the
    trainers' network rules the fence reads NetworkPolicies against."""
    core, networking = client.CoreV1Api(kube), client.NetworkingV1Api(kube)
    try:
        core.create_namespace({"metadata": {"name": SYSTEM_NAMESPACE}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    rules = trainer_rules_policy()
    try:
        networking.create_namespaced_network_policy(SYSTEM_NAMESPACE, rules)
    except ApiException as exc:
        if exc.status != 409:
            raise
        networking.replace_namespaced_network_policy(rules["metadata"]["name"], SYSTEM_NAMESPACE, rules)
    admission_policies_install(kube, operator_fence_policies())


def finetune_crd_install(kube: client.ApiClient) -> str:
    """Create or update the CRDs as the models generate them (FineTuneJob, ModelServer), wait until
    both are Established, then the admission policies that come with them in the chart (one of the
    fence's reads FineTuneJobs as its parameters: its kind must be served first, as Helm installs
    the chart's crds/ first)."""
    api = client.ApiextensionsV1Api(kube)
    for body in (crd_model.crd(), server_crd.crd()):
        try:
            api.create_custom_resource_definition(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            _replace_latest(body, api.read_custom_resource_definition, api.replace_custom_resource_definition)

    def established() -> bool:
        found = [
            api.read_custom_resource_definition(name).status.conditions or [] for name in (CRD_NAME, SERVER_CRD_NAME)
        ]
        return all(any(c.type == "Established" and c.status == "True" for c in conditions) for conditions in found)

    wait_for(established, 30, "the FineTuneJob and ModelServer CRDs to be Established")
    trainer_status_policy_install(kube)
    operator_fence_install(kube)
    return CRD_NAME


def make_claim(core: client.CoreV1Api, namespace: str, name: str, size: str = "1Gi") -> None:
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}},
        },
    )


def wait_bound(core: client.CoreV1Api, namespace: str, name: str) -> None:
    wait_for(
        lambda: core.read_namespaced_persistent_volume_claim(name, namespace).status.phase == "Bound",
        60,
        f"PVC {namespace}/{name} to be Bound",
    )

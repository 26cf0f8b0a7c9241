"""Fixtures for the operator's end-to-end tests: the CRD, the operator's own identity, one
operator process per test namespace, and PVC folders holding a tiny model and dataset."""

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from finetune_api import crd as crd_model
from finetune_api.constants import CRD_NAME

from .harness import (
    Jobs,
    OperatorProcess,
    operator_fence_policies,
    operator_identity,
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
            name = body["metadata"]["name"]
            version = read(name).metadata.resource_version
            replace(name, {**body, "metadata": {**body["metadata"], "resourceVersion": version}})


def trainer_status_policy_install(kube: client.ApiClient) -> None:
    """The chart's admission policy that keeps each trainer to its own job."""
    admission_policies_install(kube, trainer_status_policy())


def operator_fence_install(kube: client.ApiClient) -> None:
    """The chart's fence around the operator's own token, for the tests' operator account: every
    test that runs the operator runs it inside the fence, as the chart installs it."""
    admission_policies_install(kube, operator_fence_policies())


def finetune_crd_install(kube: client.ApiClient) -> str:
    """Create or update the CRD as the models generate it, and the admission policies that come
    with it in the chart; wait until the CRD is Established."""
    trainer_status_policy_install(kube)
    operator_fence_install(kube)
    api = client.ApiextensionsV1Api(kube)
    body = crd_model.crd()
    try:
        api.create_custom_resource_definition(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        current = api.read_custom_resource_definition(CRD_NAME)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        api.replace_custom_resource_definition(CRD_NAME, body)

    def established() -> bool:
        found = api.read_custom_resource_definition(CRD_NAME)
        return any(c.type == "Established" and c.status == "True" for c in found.status.conditions or [])

    wait_for(established, 30, "the FineTuneJob CRD to be Established")
    return CRD_NAME


@pytest.fixture(scope="session")
def finetune_crd(kube: client.ApiClient) -> str:
    return finetune_crd_install(kube)


@pytest.fixture(scope="session")
def operator_kubeconfig(
    cluster: Any, kube: client.ApiClient, finetune_crd: str, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A kubeconfig for the operator's own ServiceAccount, bound to the chart's RBAC rules."""
    return operator_identity(kube, Path(cluster.kubeconfig), tmp_path_factory.mktemp("operator-identity"))


@pytest.fixture
def start_operator(
    operator_kubeconfig: Path, namespace: str, tmp_path: Path
) -> Iterator[Callable[..., OperatorProcess]]:
    """Start `python -m finetune_operator -n NAMESPACE`; every one started is stopped afterwards."""
    started: list[OperatorProcess] = []

    def start(env: dict[str, str] | None = None, wait: bool = True) -> OperatorProcess:
        proc = OperatorProcess(operator_kubeconfig, namespace, tmp_path / f"operator-{len(started)}.log", env)
        started.append(proc)
        return proc.start(wait=wait)

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def operator(start_operator: Callable[..., OperatorProcess]) -> OperatorProcess:
    return start_operator()


@pytest.fixture
def jobs(kube: client.ApiClient, namespace: str) -> Jobs:
    return Jobs(kube, namespace)


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-init Llama and a learnable Alpaca file, made once per session."""
    from finetune_trainer.tiny_model import make_tiny_model, write_alpaca

    root = tmp_path_factory.mktemp("tiny-assets")
    make_tiny_model(root / "model" / "tiny-llama")
    write_alpaca(root / "data" / "tiny" / "alpaca.jsonl", count=64)
    return root


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


@pytest.fixture
def training_volumes(cluster: Any, core: client.CoreV1Api, namespace: str, tiny_assets: Path) -> dict[str, Path]:
    """PVCs models, datasets, outputs in the test namespace; the first two filled with the tiny assets."""
    folders: dict[str, Path] = {}
    for claim in ("models", "datasets", "outputs"):
        make_claim(core, namespace, claim)
    for claim, source in (("models", tiny_assets / "model"), ("datasets", tiny_assets / "data"), ("outputs", None)):
        wait_bound(core, namespace, claim)
        folder = Path(cluster.volume_dir(namespace, claim))
        wait_for(folder.is_dir, 30, f"the folder of PVC {claim}")
        if source is not None:
            shutil.copytree(source, folder, dirs_exist_ok=True)
        folders[claim] = folder
    return folders

"""Fixtures for the operator's end-to-end tests: the CRD, the operator's own identity, one
operator process per test namespace, and PVC folders holding a tiny model and dataset."""

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.support.harness import (
    Jobs,
    OperatorProcess,
    operator_identity,
    wait_for,
)
from tests.support.install import finetune_crd_install, make_claim, wait_bound


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
    from finetune_trainer.model.tiny_model import make_tiny_model, write_alpaca

    root = tmp_path_factory.mktemp("tiny-assets")
    make_tiny_model(root / "model" / "tiny-llama")
    write_alpaca(root / "data" / "tiny" / "alpaca.jsonl", count=64)
    return root


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

"""The output PersistentVolumeClaim the operator creates when `output.storage` is set."""

from typing import Any

from finetune_api import contract
from finetune_api.spec import FineTuneJobSpec

from ..children import Owner, metadata


def output_claim_name(owner: Owner, spec: FineTuneJobSpec) -> str:
    return contract.output_claim_name(owner.name, spec)


def output_pvc(owner: Owner, spec: FineTuneJobSpec) -> dict[str, Any] | None:
    """None when the user brings their own claim. Not owned unless asked: outputs outlive the job."""
    storage = spec.output.storage
    if storage is None:
        return None
    name = output_claim_name(owner, spec)
    claim_spec: dict[str, Any] = {
        # Every pod of a job of several nodes mounts it (one pod template), on other machines.
        "accessModes": ["ReadWriteMany" if spec.resources.multinode else "ReadWriteOnce"],
        "resources": {"requests": {"storage": storage.size}},
    }
    if storage.storage_class_name:
        claim_spec["storageClassName"] = storage.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(owner, name, contract.COMPONENT_OUTPUT, owned=storage.delete_with_job),
        "spec": claim_spec,
    }

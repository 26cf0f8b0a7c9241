"""The output PersistentVolumeClaim the operator creates when `output.storage` is set."""

from typing import Any

from finetune_api.spec import FineTuneJobSpec

from ..children import COMPONENT_OUTPUT, Owner, metadata, output_pvc_name


def output_claim_name(owner: Owner, spec: FineTuneJobSpec) -> str:
    if spec.output.pvc is not None:
        return spec.output.pvc.claim_name
    return output_pvc_name(owner.name)


def output_pvc(owner: Owner, spec: FineTuneJobSpec) -> dict[str, Any] | None:
    """None when the user brings their own claim. Not owned unless asked: outputs outlive the job."""
    storage = spec.output.storage
    if storage is None:
        return None
    claim_spec: dict[str, Any] = {
        # Every pod of a job of several nodes mounts it (one pod template), on other machines.
        "accessModes": ["ReadWriteMany" if spec.resources.nodes > 1 else "ReadWriteOnce"],
        "resources": {"requests": {"storage": storage.size}},
    }
    if storage.storage_class_name:
        claim_spec["storageClassName"] = storage.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(owner, output_pvc_name(owner.name), COMPONENT_OUTPUT, owned=storage.delete_with_job),
        "spec": claim_spec,
    }

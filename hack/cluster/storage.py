"""PVC binding for pods on KWOK nodes and on `local-0` alike: a default StorageClass and a tiny provisioner.

The provisioner (test support, not product code) watches claims of the default class and
answers each with a hostPath PersistentVolume at `.cache/cluster/volumes/<namespace>/<claim>/`,
pre-bound to the claim; the real PV controller in kube-controller-manager finishes the binding.
When a claim is deleted its volume is Released and the provisioner removes the PV and folder.
Run as `python -m hack.cluster.storage`.
"""

import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from .layout import Layout

STORAGE_CLASS = "local-folder"
PROVISIONER = "finetune.dev/local-folder"

log = logging.getLogger("provisioner")


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        # Immediate: claims bind before any pod exists, so scheduling sees bound claims everywhere.
        "volumeBindingMode": "Immediate",
        "allowVolumeExpansion": True,
    }


def volume_name(claim_uid: str) -> str:
    return f"pvc-{claim_uid}"


def persistent_volume(claim: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The PV that answers `claim`, pre-bound to it by uid."""
    meta = claim["metadata"]
    spec = claim.get("spec", {})
    requested = spec.get("resources", {}).get("requests", {}).get("storage", "1Gi")
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": volume_name(meta["uid"]),
            "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": requested},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": STORAGE_CLASS,
            "volumeMode": spec.get("volumeMode", "Filesystem"),
            "hostPath": {"path": str(folder), "type": "DirectoryOrCreate"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
        },
    }


def wants_volume(claim: dict[str, Any]) -> bool:
    spec = claim.get("spec", {})
    annotations = claim["metadata"].get("annotations") or {}
    ours = (
        annotations.get("volume.kubernetes.io/storage-provisioner") == PROVISIONER
        or spec.get("storageClassName") == STORAGE_CLASS
    )
    return ours and not spec.get("volumeName") and claim.get("status", {}).get("phase") == "Pending"


class Provisioner:
    def __init__(self, layout: Layout, core: Any) -> None:
        self.layout = layout
        self.core = core

    def provision(self, claim: dict[str, Any]) -> None:
        from kubernetes.client.rest import ApiException

        meta = claim["metadata"]
        folder = self.layout.volume_dir(meta["namespace"], meta["name"])
        folder.mkdir(parents=True, exist_ok=True)
        # Pods may run as any uid (and KWOK pods never touch the folder): world-writable like an emptyDir.
        folder.chmod(0o777)
        try:
            self.core.create_persistent_volume(persistent_volume(claim, folder))
            log.info("provisioned %s/%s at %s", meta["namespace"], meta["name"], folder)
        except ApiException as err:
            if err.status != 409:
                raise

    def reclaim(self, volume: dict[str, Any]) -> None:
        from kubernetes.client.rest import ApiException

        path = Path(volume["spec"]["hostPath"]["path"])
        if path.is_relative_to(self.layout.volumes):
            shutil.rmtree(path, ignore_errors=True)
        try:
            self.core.delete_persistent_volume(volume["metadata"]["name"])
            log.info("reclaimed %s", volume["metadata"]["name"])
        except ApiException as err:
            if err.status != 404:
                raise

    def sync(self) -> str:
        """One level-based pass: every pending claim gets a volume, every released volume goes.

        Returns the claim list's resourceVersion, where the next watch starts.
        """
        api = self.core.api_client
        claims = api.sanitize_for_serialization(self.core.list_persistent_volume_claim_for_all_namespaces())
        for claim in claims.get("items", []):
            if wants_volume(claim):
                self.provision(claim)
        volumes = api.sanitize_for_serialization(self.core.list_persistent_volume())
        for volume in volumes.get("items", []):
            annotations = volume["metadata"].get("annotations") or {}
            if (
                annotations.get("pv.kubernetes.io/provisioned-by") == PROVISIONER
                and volume.get("status", {}).get("phase") in ("Released", "Failed")
                and "hostPath" in volume["spec"]
            ):
                self.reclaim(volume)
        return str(claims["metadata"].get("resourceVersion", ""))


def main() -> int:
    from kubernetes import client, config, watch

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    layout = Layout.for_repo()
    config.load_kube_config(str(layout.kubeconfig))
    core = client.CoreV1Api()
    provisioner = Provisioner(layout, core)
    while True:
        try:
            version = provisioner.sync()
            # Any claim event triggers a full pass; the timeout bounds how late a released PV goes.
            stream = watch.Watch().stream(
                core.list_persistent_volume_claim_for_all_namespaces, resource_version=version, timeout_seconds=5
            )
            for _ in stream:
                provisioner.sync()
        except Exception as err:  # the loop must outlive API restarts and transient errors
            log.warning("sync failed: %s", err)
            time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())

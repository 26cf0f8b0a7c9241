"""Claims bind through the default StorageClass; their folder lives under .cache/cluster/volumes/."""

import pytest
from kubernetes import client

from tests.fixtures.cluster import Cluster, wait_for

pytestmark = pytest.mark.cluster


def test_a_claim_binds_to_its_folder_and_the_folder_goes_with_it(
    cluster: Cluster, core: client.CoreV1Api, namespace: str
) -> None:
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": "ckpt"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}},
        },
    )
    claim = wait_for(
        lambda: (c := core.read_namespaced_persistent_volume_claim("ckpt", namespace)).status.phase == "Bound" and c,
        30,
        "the claim to bind",
    )
    assert claim.spec.storage_class_name == "local-folder"
    folder = cluster.volume_dir(namespace, "ckpt")
    assert core.read_persistent_volume(claim.spec.volume_name).spec.host_path.path == str(folder)
    assert folder.is_dir()
    core.delete_namespaced_persistent_volume_claim("ckpt", namespace)
    wait_for(lambda: not folder.exists(), 60, "the released volume's folder to be removed")

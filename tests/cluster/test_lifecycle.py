"""`up` is idempotent and quick when warm; binaries come from the versioned cache outside the checkout."""

import json
import os
from pathlib import Path

import pytest

from hack.cluster import binaries
from hack.cluster.layout import REPO_ROOT, binary_cache_root
from tests.fixtures.cluster import Cluster, run_cluster_command

pytestmark = pytest.mark.cluster


def test_binaries_are_linked_from_the_versioned_cache(cluster: Cluster) -> None:
    cache = binary_cache_root()
    assert not cache.resolve().is_relative_to(REPO_ROOT)
    for component in binaries.COMPONENTS:
        for name in component.binaries:
            link = cluster.layout.bin / name
            assert link.is_symlink(), name
            target = link.readlink()
            if not os.environ.get("KUBEBUILDER_ASSETS"):
                assert target == cache / component.folder / name


def test_warm_up_returns_at_once_and_keeps_the_cluster(cluster: Cluster) -> None:
    before = cluster.layout.state.read_text()
    seconds = run_cluster_command("up")
    assert seconds < 30
    assert cluster.layout.state.read_text() == before


def test_a_second_cluster_comes_up_and_down_leaves_no_process(cluster: Cluster, tmp_path: Path) -> None:
    """A whole up/down cycle next to the session's cluster (as a CI clone would run beside a dev one)."""
    state_dir = tmp_path / "cluster"
    env = {"FINETUNE_CLUSTER_DIR": str(state_dir)}
    try:
        run_cluster_command("up", env)
        pids = [json.loads(p.read_text())["pid"] for p in (state_dir / "pids").glob("*.json")]
        assert len(pids) == 7
        assert all(_running(pid) for pid in pids)
    finally:
        run_cluster_command("down", env)
    assert not [pid for pid in pids if _running(pid)]
    assert sorted(p.name for p in state_dir.iterdir()) == ["bin"]


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"

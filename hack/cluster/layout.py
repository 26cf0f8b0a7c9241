"""Where the cluster keeps its binaries and state.

Binaries are built once per version into a cache outside the checkout
(`${FINETUNE_CACHE:-~/.cache/finetune-operator}/<component>-<version>/`) so that every clone on
the machine (CI clones into a fresh folder) reuses them; the checkout sees them through symlinks
in `.cache/cluster/bin/`. Everything else lives in `.cache/cluster/` and goes away on `down`.
"""

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..cache import binary_cache_root  # noqa: F401 (where the cluster's binaries are, named here as well)

REPO_ROOT = Path(__file__).resolve().parents[2]

# The nodes the agent owns; pods bound to them run as local processes. `local-0` takes any CPU
# pod; the others are tainted (nodes.LOCAL_EXTRA_TAINT), so only pods that ask for them (the
# pods of a multi-node job) land there and every other pod stays on `local-0`, as before.
LOCAL_NODE = "local-0"
LOCAL_NODES = (LOCAL_NODE, "local-1")


# Overrides where the state lives (tests start a second, throwaway cluster this way).
STATE_DIR_ENV = "FINETUNE_CLUSTER_DIR"


@dataclass(frozen=True)
class Layout:
    """Paths of one checkout's cluster; pure, so tests and tools agree on them."""

    root: Path
    repo: Path = REPO_ROOT

    @classmethod
    def for_repo(cls, repo: Path = REPO_ROOT) -> "Layout":
        override = os.environ.get(STATE_DIR_ENV)
        return cls(Path(override) if override else repo / ".cache" / "cluster", repo)

    @property
    def lock(self) -> Path:
        """Serialises `up`, `down` and session bookkeeping of this cluster (outside root: `down` empties root)."""
        return self.root.with_name(f"{self.root.name}.lock")

    @property
    def sessions(self) -> Path:
        """One file per live test session using the cluster (pid and start time)."""
        return self.root / "sessions"

    @property
    def session_owned(self) -> Path:
        """Present when a test session started the cluster: the last session to leave stops it."""
        return self.root / "session-owned"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def volumes(self) -> Path:
        return self.root / "volumes"

    @property
    def pods(self) -> Path:
        """Per-pod folders of the node agent (scripts, logs, emptyDirs, termination logs)."""
        return self.root / "pods"

    @property
    def state(self) -> Path:
        """Ports and settings of the running cluster, written by `up`."""
        return self.root / "state.json"

    @property
    def venv_bin(self) -> Path:
        """The project's `.venv/bin`, else the folder of the interpreter running this (another venv)."""
        venv = self.repo / ".venv" / "bin"
        return venv if venv.is_dir() else Path(sys.executable).parent

    def volume_dir(self, namespace: str, claim: str) -> Path:
        return self.volumes / namespace / claim

"""The build cache every checkout on the machine shares: where it is, and its lock.

`${FINETUNE_CACHE:-~/.cache/finetune-operator}/`: the control plane's binaries (hack/cluster) and
llama.cpp's builds (hack/llama_cpp.py) are made there once per version. Both stand on this
module, so the cluster's node agent may read where llama.cpp's tools are without a circle.
"""

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def binary_cache_root() -> Path:
    configured = os.environ.get("FINETUNE_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "finetune-operator"


@contextmanager
def cache_lock(cache: Path) -> Iterator[None]:
    """Two checkouts starting at once must not build the same thing twice on two cores."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield

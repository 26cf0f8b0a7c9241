"""The binaries the control plane runs: which versions, how each is built, where it is cached.

Only package registries are reachable where this runs, so every component is built from the Go
module proxy by the project's own wrappers in hack/k8s-build/. A build happens once per version
(under a lock, into a temporary folder renamed into place, so a killed build leaves nothing
half-written); `KUBEBUILDER_ASSETS`, when set, supplies any binary it holds instead.
"""

import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .layout import REPO_ROOT, Layout, binary_cache_root

K8S_VERSION = "v1.34.4"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.7.0"
HELM_VERSION = "v3.19.5"

BUILD_DIR = REPO_ROOT / "hack" / "k8s-build"


@dataclass(frozen=True)
class Component:
    """One versioned cache folder and the binaries a single build puts in it."""

    name: str
    version: str
    binaries: tuple[str, ...]

    @property
    def folder(self) -> str:
        return f"{self.name}-{self.version}"


def _k8s_ldflags() -> str:
    major, minor, _ = K8S_VERSION.lstrip("v").split(".")
    return (
        f"-s -w -X k8s.io/component-base/version.gitVersion={K8S_VERSION}"
        f" -X k8s.io/component-base/version.gitMajor={major} -X k8s.io/component-base/version.gitMinor={minor}"
    )


KUBERNETES = Component("k8s", K8S_VERSION, ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"))
ETCD = Component("etcd", ETCD_VERSION, ("etcd",))
KWOK = Component("kwok", KWOK_VERSION, ("kwok",))
HELM = Component("helm", HELM_VERSION, ("helm",))
COMPONENTS = (KUBERNETES, ETCD, KWOK, HELM)


def _build_commands(component: Component, missing: tuple[str, ...], out: Path) -> tuple[list[str], Path]:
    """(command, working directory) that builds `missing` of `component` into folder `out`."""
    if component is KUBERNETES:
        cmd_path = {name: f"k8s.io/kubernetes/cmd/{name}" for name in component.binaries}
        return ["go", "build", "-ldflags", _k8s_ldflags(), "-o", f"{out}/", *(cmd_path[m] for m in missing)], BUILD_DIR
    if component is ETCD:
        return ["go", "build", "-ldflags", "-s -w", "-o", str(out / "etcd"), "."], BUILD_DIR / "etcd"
    if component is KWOK:
        return ["go", "install", "-ldflags", "-s -w", f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}"], out
    if component is HELM:
        flags = f"-s -w -X helm.sh/helm/v3/internal/version.version={HELM_VERSION}"
        return ["go", "install", "-ldflags", flags, f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}"], out
    raise ValueError(component.name)


@contextmanager
def _cache_lock(cache: Path) -> Iterator[None]:
    """Two checkouts starting at once must not build the same thing twice on two cores."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _assets_dir() -> Path | None:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    return Path(assets) if assets else None


def resolve(name: str, cache: Path | None = None) -> Path | None:
    """Where binary `name` is, preferring KUBEBUILDER_ASSETS; None when it must be built."""
    assets = _assets_dir()
    if assets and (assets / name).is_file():
        return assets / name
    for component in COMPONENTS:
        if name in component.binaries:
            path = (cache or binary_cache_root()) / component.folder / name
            return path if path.is_file() else None
    raise KeyError(name)


def build(component: Component, missing: tuple[str, ...], cache: Path) -> None:
    if shutil.which("go") is None:
        raise SystemExit(f"cluster: `go` is not on PATH; it is needed once to build {', '.join(missing)}")
    final = cache / component.folder
    tmp = cache / f".{component.folder}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    command, cwd = _build_commands(component, missing, tmp)
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false", "GOBIN": str(tmp)}
    print(f"cluster: building {', '.join(missing)} ({component.version}); first time only", file=sys.stderr, flush=True)
    started = time.monotonic()
    result = subprocess.run(command, cwd=cwd, env=env, check=False)
    if result.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SystemExit(f"cluster: build failed ({result.returncode}): {' '.join(command)} (in {cwd})")
    final.mkdir(parents=True, exist_ok=True)
    for name in missing:
        (tmp / name).replace(final / name)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"cluster: built {', '.join(missing)} in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)


def ensure(layout: Layout) -> dict[str, Path]:
    """Every binary, built where missing, and linked into the checkout's `.cache/cluster/bin/`."""
    cache = binary_cache_root()
    found: dict[str, Path] = {}
    with _cache_lock(cache):
        for component in COMPONENTS:
            missing = tuple(name for name in component.binaries if resolve(name, cache) is None)
            if missing:
                build(component, missing, cache)
            for name in component.binaries:
                path = resolve(name, cache)
                assert path is not None, name
                found[name] = path
    layout.bin.mkdir(parents=True, exist_ok=True)
    for name, path in found.items():
        link = layout.bin / name
        if link.is_symlink() or link.exists():
            if link.is_symlink() and link.readlink() == path:
                continue
            link.unlink()
        link.symlink_to(path)
    return found

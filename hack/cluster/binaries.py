"""The binaries the control plane runs: which versions, how each is built, where it is cached.

Only package registries are reachable where this runs, so every component is built from the Go
module proxy by the project's own wrappers in hack/k8s-build/ (or `go install`ed where its module
has no replace lines: KWOK, Helm, Kueue, promtool, MinIO). Kueue, promtool and MinIO are optional: built the
first time they are needed (`ensure_component`), never by `up`; Kueue with the manifests it ships
in its module copied beside the binary. The Prometheus Operator's CRDs are read from its
module copy (`prometheus_operator_crd`), nothing built. A build happens once per version
(under a lock, into a temporary folder renamed into place, so a killed build leaves nothing
half-written); `KUBEBUILDER_ASSETS`, when set, supplies any binary it holds instead.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..cache import cache_lock
from .layout import REPO_ROOT, Layout, binary_cache_root

K8S_VERSION = "v1.34.4"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.7.0"
HELM_VERSION = "v3.19.5"
# Optional: built the first time a test (or `python -m hack.cluster kueue-up`) needs it.
KUEUE_VERSION = "v0.17.0"
KUEUE_MODULE = "sigs.k8s.io/kueue"
# Optional: promtool checks and unit-tests the chart's PrometheusRule (tests/chart/test_monitoring.py).
# Prometheus tags its Go module v0.<major><minor>.<patch>: v0.316.0 is Prometheus 3.16.0.
PROMETHEUS_VERSION = "v0.316.0"
PROMETHEUS_MODULE = "github.com/prometheus/prometheus"
# Optional: MinIO's server, the S3-compatible store the object-storage tests read models and data
# from and copy outputs to (tests/fixtures/object_store.py). Its Go module has no release tags
# (MinIO tags releases RELEASE.<date>, which Go does not read as versions): a pseudo-version,
# the last commit of its repository, pinned here; its go.mod has no replace lines.
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
MINIO_MODULE = "github.com/minio/minio"
# The Prometheus Operator's CRDs (PrometheusRule, ServiceMonitor), read from its module copy:
# the chart's monitoring objects are dry-run against them on the local API server.
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
PROMETHEUS_OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator"
PROMETHEUS_OPERATOR_CRDS = "example/prometheus-operator-crd"
# Kueue's own manifests, copied from its module beside the binary: the CRDs, the kustomization
# that says which of them get a conversion webhook (and the patches that add it), and the
# admission webhook configurations.
KUEUE_MANIFESTS = "manifests"
KUEUE_MANIFEST_SOURCES = {
    "crd": "config/components/crd/bases",
    "crd-kustomization": "config/components/crd",
    "crd-kustomization/patches": "config/components/crd/patches",
    "webhook": "config/components/webhook",
}

BUILD_DIR = REPO_ROOT / "hack" / "k8s-build"


@dataclass(frozen=True)
class Component:
    """One versioned cache folder and the binaries a single build puts in it."""

    name: str
    version: str
    binaries: tuple[str, ...]
    # Folders the build leaves beside the binaries (e.g. manifests that ship in the module).
    extras: tuple[str, ...] = ()

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
KUEUE = Component("kueue", KUEUE_VERSION, ("kueue",), (KUEUE_MANIFESTS,))
PROMTOOL = Component("promtool", PROMETHEUS_VERSION, ("promtool",))
MINIO = Component("minio", MINIO_VERSION, ("minio",))
# Built on demand only (ensure_component), never by `up`.
OPTIONAL = (KUEUE, PROMTOOL, MINIO)


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
    if component is KUEUE:
        flags = f"-s -w -X {KUEUE_MODULE}/pkg/version.GitVersion={KUEUE_VERSION}"
        return ["go", "install", "-ldflags", flags, f"{KUEUE_MODULE}/cmd/kueue@{KUEUE_VERSION}"], out
    if component is PROMTOOL:
        return ["go", "install", "-ldflags", "-s -w", f"{PROMETHEUS_MODULE}/cmd/promtool@{PROMETHEUS_VERSION}"], out
    if component is MINIO:
        return ["go", "install", "-ldflags", "-s -w", f"{MINIO_MODULE}@{MINIO_VERSION}"], out
    raise ValueError(component.name)


def _module_dir(module: str, version: str, env: dict[str, str]) -> Path:
    """Where the Go module cache holds `module@version` (downloading it if needed)."""
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"], env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise SystemExit(f"cluster: go mod download {module}@{version} failed: {result.stderr.strip()}")
    return Path(json.loads(result.stdout)["Dir"])


def prometheus_operator_crd(plural: str) -> Path:
    """The Prometheus Operator's CRD of `plural` (e.g. prometheusrules), from the Go module cache
    (downloaded from the module proxy the first time; nothing to build)."""
    if shutil.which("go") is None:
        raise SystemExit(f"cluster: `go` is not on PATH; it is needed once to fetch the {plural} CRD")
    module = _module_dir(PROMETHEUS_OPERATOR_MODULE, PROMETHEUS_OPERATOR_VERSION, dict(os.environ))
    return module / PROMETHEUS_OPERATOR_CRDS / f"monitoring.coreos.com_{plural}.yaml"


def _copy_extras(component: Component, out: Path, env: dict[str, str]) -> None:
    """The manifests a component ships in its module, copied beside its binary."""
    if component is not KUEUE:
        return
    module = _module_dir(KUEUE_MODULE, KUEUE_VERSION, env)
    for name, source in KUEUE_MANIFEST_SOURCES.items():
        target = out / KUEUE_MANIFESTS / name
        target.mkdir(parents=True)
        for path in sorted((module / source).glob("*.yaml")):
            # The module cache is read-only: copy the bytes, not the mode.
            (target / path.name).write_bytes(path.read_bytes())


def _assets_dir() -> Path | None:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    return Path(assets) if assets else None


def resolve(name: str, cache: Path | None = None) -> Path | None:
    """Where binary `name` is, preferring KUBEBUILDER_ASSETS; None when it must be built."""
    assets = _assets_dir()
    if assets and (assets / name).is_file():
        return assets / name
    for component in COMPONENTS + OPTIONAL:
        if name in component.binaries:
            path = (cache or binary_cache_root()) / component.folder / name
            return path if path.is_file() else None
    raise KeyError(name)


def _missing_extras(component: Component, cache: Path) -> tuple[str, ...]:
    return tuple(name for name in component.extras if not (cache / component.folder / name).is_dir())


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
    try:
        _copy_extras(component, tmp, env)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final.mkdir(parents=True, exist_ok=True)
    for name in missing:
        (tmp / name).replace(final / name)
    for name in component.extras:
        shutil.rmtree(final / name, ignore_errors=True)
        (tmp / name).replace(final / name)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"cluster: built {', '.join(missing)} in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)


def _link(layout: Layout, found: dict[str, Path]) -> None:
    layout.bin.mkdir(parents=True, exist_ok=True)
    for name, path in found.items():
        link = layout.bin / name
        if link.is_symlink() or link.exists():
            if link.is_symlink() and link.readlink() == path:
                continue
            link.unlink()
        link.symlink_to(path)


def ensure_component(layout: Layout, component: Component) -> Path:
    """An optional component, built where missing (binaries and extras); its cache folder."""
    cache = binary_cache_root()
    folder = cache / component.folder

    def incomplete() -> bool:
        missing = tuple(name for name in component.binaries if not (folder / name).is_file())
        return bool(missing or _missing_extras(component, cache))

    # Builds land by rename, so a complete folder seen without the lock is complete: a checkout
    # that needs nothing built does not wait behind another's long build of something else.
    if incomplete():
        with cache_lock(cache):
            if incomplete():
                # Extras come from the same build: a folder without them is built again whole.
                build(component, component.binaries, cache)
    _link(layout, {name: folder / name for name in component.binaries})
    return folder


def ensure(layout: Layout) -> dict[str, Path]:
    """Every binary, built where missing, and linked into the checkout's `.cache/cluster/bin/`."""
    cache = binary_cache_root()
    found: dict[str, Path] = {}
    if all(resolve(name, cache) for component in COMPONENTS for name in component.binaries):
        found = {name: path for c in COMPONENTS for name in c.binaries if (path := resolve(name, cache))}
        _link(layout, found)
        return found
    with cache_lock(cache):
        for component in COMPONENTS:
            missing = tuple(name for name in component.binaries if resolve(name, cache) is None)
            if missing:
                build(component, missing, cache)
            for name in component.binaries:
                path = resolve(name, cache)
                assert path is not None, name
                found[name] = path
    _link(layout, found)
    return found


def ensure_all(layout: Layout) -> int:
    """Every binary, the optional ones too, built where missing; nothing started."""
    ensure(layout)
    for component in OPTIONAL:
        ensure_component(layout, component)
    return 0

"""`up` and `down`: the order things start and stop in, and what "ready" means."""

import contextlib
import fcntl
import json
import os
import shutil
import signal
import ssl
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from . import binaries, kueue, pki, processes
from .control_plane import (
    ClusterState,
    Ports,
    admin_ssl_context,
    apiserver_args,
    controller_manager_args,
    etcd_args,
    http_ok,
    kubeconfig,
    kwok_args,
    scheduler_args,
    wait_until,
)
from .layout import LOCAL_NODES, Layout
from .nodes import gpu_nodes
from .storage import storage_class

# Stop order: the node agent first (it stops its pods' processes), the storage last.
DAEMONS = ("node-agent", "provisioner", "kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")


def _say(message: str) -> None:
    print(f"cluster: {message}", file=sys.stderr, flush=True)


def running(layout: Layout) -> bool:
    """True when this checkout's cluster is up and answering (then `up` has nothing to do)."""
    if not (layout.state.is_file() and layout.kubeconfig.is_file()):
        return False
    if not all(processes.alive(layout, name) for name in DAEMONS):
        return False
    state = ClusterState.load(layout.state)
    return http_ok(f"{state.server}/readyz", admin_ssl_context(pki.Pki(layout.pki)))


def _apply(layout: Layout) -> Any:
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    # Its own configuration: `up` may run inside a test session, whose global client config is not ours to set.
    configuration = client.Configuration()
    config.load_kube_config(str(layout.kubeconfig), client_configuration=configuration)
    api = client.ApiClient(configuration)
    core = client.CoreV1Api(api)
    storage = client.StorageV1Api(api)
    for create, body in [(storage.create_storage_class, storage_class())] + [
        (core.create_node, n) for n in gpu_nodes()
    ]:
        try:
            create(body)
        except ApiException as err:
            if err.status != 409:
                raise
    return core


# The node lifecycle controller taints a new node until it has seen it Ready; the scheduler
# places nothing there until then.
NOT_READY_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


def _nodes_ready(core: Any, expected: set[str]) -> bool:
    ready = set()
    for node in core.list_node().items:
        untainted = not any(t.key in NOT_READY_TAINTS for t in node.spec.taints or [])
        if untainted and any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or []):
            ready.add(node.metadata.name)
    return expected <= ready


def _default_account(core: Any) -> bool:
    from kubernetes.client.rest import ApiException

    try:
        core.read_namespaced_service_account("default", "default")
        core.read_namespaced_config_map("kube-root-ca.crt", "default")
    except ApiException:
        return False
    return True


@contextlib.contextmanager
def _locked(layout: Layout) -> Iterator[None]:
    """One `up`/`down` at a time per cluster: several test sessions share a checkout's cluster."""
    layout.lock.parent.mkdir(parents=True, exist_ok=True)
    with layout.lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def up() -> int:
    """Start the cluster unless it runs; one started here has no session-owned mark, so sessions leave it up."""
    layout = Layout.for_repo()
    with _locked(layout):
        _up_locked(layout)
    return 0


def _up_locked(layout: Layout) -> None:
    started = time.monotonic()
    found = binaries.ensure(layout)
    if running(layout):
        _say(f"already running; kubeconfig {layout.kubeconfig} ({time.monotonic() - started:.1f}s)")
        return
    if layout.pids.is_dir() or layout.state.exists():
        _say("cleaning up a previous cluster that is not healthy")
        _down_locked(layout)
    for attempt in (1, 2):
        try:
            _start(layout, found, started)
            return
        except SystemExit as exc:
            # Never leave half a cluster running: the next `up` starts from nothing. The logs go
            # with it, so show their ends first: a CI run has nothing else to look at.
            _print_log_tails(layout)
            _down_locked(layout)
            # A component that dies during start-up (seen: etcd right after a previous cluster
            # of this folder stopped) gets one clean second try; a real fault fails twice.
            if attempt == 2:
                raise
            _say(f"{exc}; starting again from nothing")
        except BaseException:
            _print_log_tails(layout)
            _down_locked(layout)
            raise


def _start(layout: Layout, found: dict[str, Path], started: float) -> None:
    # A data folder left by a cluster that was not stopped cleanly holds another member's
    # identity and ports; etcd would wait for that member forever. Every `up` starts empty.
    shutil.rmtree(layout.etcd_data, ignore_errors=True)
    for folder in (layout.logs, layout.pids, layout.volumes, layout.pods, layout.etcd_data):
        folder.mkdir(parents=True, exist_ok=True)
    layout.etcd_data.chmod(0o700)
    certs = pki.create(layout.pki)
    ports = Ports.free()
    state = ClusterState(ports)
    state.save(layout.state)
    layout.kubeconfig.write_text(yaml.safe_dump(kubeconfig(state.server, certs)))
    layout.kubeconfig.chmod(0o600)
    context = admin_ssl_context(certs)

    def alive(name: str) -> Callable[[], bool]:
        return lambda: processes.alive(layout, name)

    processes.start(layout, "etcd", etcd_args(found["etcd"], layout, ports))
    wait_until("etcd", lambda: http_ok(f"http://127.0.0.1:{ports.etcd_client}/health"), 30, alive("etcd"))
    processes.start(layout, "kube-apiserver", apiserver_args(found["kube-apiserver"], certs, ports))
    # Generous: on a busy 2-core machine the API server has needed over a minute.
    wait_until("kube-apiserver", lambda: http_ok(f"{state.server}/readyz", context), 240, alive("kube-apiserver"))
    _say(f"API server ready at {state.server} ({time.monotonic() - started:.1f}s)")
    processes.start(
        layout,
        "kube-controller-manager",
        controller_manager_args(found["kube-controller-manager"], layout, certs, ports),
    )
    processes.start(layout, "kube-scheduler", scheduler_args(found["kube-scheduler"], layout, ports))
    core = _apply(layout)
    processes.start(layout, "kwok", kwok_args(found["kwok"], layout, ports))
    python = sys.executable
    processes.start(layout, "provisioner", [python, "-m", "hack.cluster.storage"])
    processes.start(layout, "node-agent", [python, "-m", "hack.cluster.agent"])
    # The controllers serve healthz with their own self-signed certificates.
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE

    def healthz(port: int) -> Callable[[], bool]:
        return lambda: http_ok(f"https://127.0.0.1:{port}/healthz", insecure)

    wait_until("kube-controller-manager", healthz(ports.controller_manager), 120, alive("kube-controller-manager"))
    wait_until("kube-scheduler", healthz(ports.scheduler), 120, alive("kube-scheduler"))
    wait_until("the default ServiceAccount", lambda: _default_account(core), 120)
    expected = {n["metadata"]["name"] for n in gpu_nodes()} | set(LOCAL_NODES)
    wait_until("nodes Ready", lambda: _nodes_ready(core, expected), 120, alive("kwok"))
    wait_until("node agent", alive("node-agent"), 1)
    wait_until("provisioner", alive("provisioner"), 1)
    _say(f"up in {time.monotonic() - started:.1f}s; export KUBECONFIG={layout.kubeconfig}")


def _stop_pod_processes(layout: Layout) -> None:
    """Processes of pods the agent could not stop (it was killed): stop them by recorded pid."""
    from .agent.runner import process_start_time

    if not layout.pods.is_dir():
        return
    for record_file in layout.pods.glob("*/*.pid.json"):
        try:
            record = json.loads(record_file.read_text())
        except (OSError, ValueError):
            continue
        pid = record.get("pid")
        if isinstance(pid, int) and process_start_time(pid) == record.get("starttime"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def down() -> int:
    layout = Layout.for_repo()
    with _locked(layout):
        _down_locked(layout)
    _say("down; every process it started is stopped and its state removed")
    return 0


def _print_log_tails(layout: Layout, lines: int = 15) -> None:
    for log in sorted(layout.logs.glob("*.log")) if layout.logs.is_dir() else []:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        print(f"--- {log.name} (last {len(tail)} lines)", *tail, sep="\n", file=sys.stderr)


def _stop_strays(layout: Layout) -> None:
    """Control-plane processes of this cluster whose pid files are gone (their session was
    killed mid-start): found by the cluster folder in their command line. A stray etcd would
    hold the data folder's lock and hang the next `up`."""
    marker = str(layout.root)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        binary = Path(argv[0].decode(errors="replace")).name if argv and argv[0] else ""
        if binary in (*DAEMONS, kueue.NAME) and any(marker in a.decode(errors="replace") for a in argv[1:]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


def _down_locked(layout: Layout) -> None:
    processes.stop_all(layout, (kueue.NAME, *DAEMONS))
    _stop_pod_processes(layout)
    _stop_strays(layout)
    if layout.root.is_dir():
        for entry in layout.root.iterdir():
            if entry != layout.bin:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)


def _session_file(layout: Layout, pid: int) -> Path:
    return layout.sessions / f"{pid}.json"


def _live_sessions(layout: Layout, folder: Path | None = None) -> list[Path]:
    from .agent.runner import process_start_time

    folder = folder or layout.sessions
    live = []
    for path in folder.glob("*.json") if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if process_start_time(record["pid"]) == record["starttime"]:
            live.append(path)
    return live


def join_session(pid: int, holder: int | None = None) -> bool:
    """A test session starts using the cluster (starting it if needed); True when this call started it.
    `holder`, a process that runs several test sessions one after another (tests/run.py, whose
    parallel workers each are a session), is registered too: the cluster outlives each session
    and stops when the holder leaves."""
    layout = Layout.for_repo()
    with _locked(layout):
        started_here = not running(layout)
        if started_here:
            _up_locked(layout)
            layout.session_owned.write_text("")
        else:
            kueue.clean_if_dead(layout)
        _register(layout.sessions, pid, holder)
    return started_here


def _register(folder: Path, pid: int, holder: int | None) -> None:
    from .agent.runner import process_start_time

    folder.mkdir(parents=True, exist_ok=True)
    for member in (pid, holder) if holder else (pid,):
        record = {"pid": member, "starttime": process_start_time(member)}
        (folder / f"{member}.json").write_text(json.dumps(record))


def leave_session(pid: int) -> bool:
    """A test session is done; the last one out stops a cluster that sessions started. True when stopped."""
    layout = Layout.for_repo()
    with _locked(layout):
        _session_file(layout, pid).unlink(missing_ok=True)
        if layout.session_owned.exists() and not _live_sessions(layout):
            _down_locked(layout)
            return True
    return False


# --- Kueue: optional, shared by the sessions that ask for it, like the cluster ----------------


def kueue_up() -> int:
    """Start Kueue on the running cluster; one started here is left running by sessions."""
    layout = Layout.for_repo()
    with _locked(layout):
        if not running(layout):
            raise SystemExit("cluster: not running; `make cluster-up` first")
        kueue.up(layout)
    return 0


def kueue_down() -> int:
    layout = Layout.for_repo()
    with _locked(layout):
        kueue.down(layout)
    _say("kueue: down")
    return 0


def join_kueue(pid: int, holder: int | None = None) -> bool:
    """A test session (already in the cluster) starts using Kueue; True when this call started it.
    `holder` as for join_session."""
    layout = Layout.for_repo()
    paths = kueue.KueuePaths.of(layout)
    with _locked(layout):
        started_here = not kueue.running(layout)
        if started_here:
            kueue.up(layout)
            paths.session_owned.write_text("")
        _register(paths.sessions, pid, holder)
    return started_here


def leave_kueue(pid: int) -> bool:
    """The last session out stops a Kueue that sessions started. True when stopped."""
    layout = Layout.for_repo()
    paths = kueue.KueuePaths.of(layout)
    with _locked(layout):
        (paths.sessions / f"{pid}.json").unlink(missing_ok=True)
        if paths.session_owned.exists() and not _live_sessions(layout, paths.sessions):
            kueue.down(layout)
            return True
    return False

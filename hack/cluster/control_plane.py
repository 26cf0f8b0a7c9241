"""Command lines of the control-plane daemons, and the checks that say each one is up.

Argument builders are pure (ports and paths in, argv out) so they can be read and tested on
their own; `wait_*` functions do the polling.
"""

import json
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from .layout import Layout
from .nodes import KWOK_ANNOTATION
from .pki import SERVICE_CIDR, Pki

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
KWOK_STAGES = Path(__file__).with_name("kwok_stages.yaml")


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int
    node_agent: int

    @classmethod
    def free(cls) -> "Ports":
        """Ports nobody listens on now: a CI clone may run its own cluster next to a developer's."""
        sockets = []
        for _ in range(7):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        ports = [sock.getsockname()[1] for sock in sockets]
        for sock in sockets:
            sock.close()
        return cls(*ports)


@dataclass(frozen=True)
class ClusterState:
    """What `up` records in state.json for `down`, the fixtures and the node agent."""

    ports: Ports

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> "ClusterState":
        data = json.loads(path.read_text())
        return cls(Ports(**data["ports"]))


def etcd_args(binary: Path, layout: Layout, ports: Ports) -> list[str]:
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(binary),
        "--name=default",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        # Test state is thrown away on `down`; skipping fsync keeps a 2-core machine responsive.
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def apiserver_args(binary: Path, pki: Pki, ports: Ports) -> list[str]:
    return [
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki.cert('apiserver')}",
        f"--tls-private-key-file={pki.key('apiserver')}",
        f"--client-ca-file={pki.ca_cert}",
        f"--requestheader-client-ca-file={pki.ca_cert}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.cert('front-proxy-client')}",
        f"--proxy-client-key-file={pki.key('front-proxy-client')}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction,PodSecurity",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        # The node agent serves pods/log on the InternalIP of local-0 (127.0.0.1).
        "--kubelet-preferred-address-types=InternalIP",
        # The endpoint reconciler would publish 127.0.0.1 for the `kubernetes` Service, which
        # Endpoints validation rejects; pods reach the API through KUBERNETES_SERVICE_HOST instead.
        "--endpoint-reconciler-type=none",
        "--profiling=false",
        "--v=0",
    ]


def _controller_flags(binary: Path, layout: Layout, port: int) -> list[str]:
    """What controller-manager and scheduler share: the admin kubeconfig, no leader election
    (one of each), healthz on loopback."""
    kubeconfig = str(layout.kubeconfig)
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
    ]


def controller_manager_args(binary: Path, layout: Layout, pki: Pki, ports: Ports) -> list[str]:
    return [
        *_controller_flags(binary, layout, ports.controller_manager),
        f"--service-account-private-key-file={pki.sa_key}",
        f"--root-ca-file={pki.ca_cert}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        "--controllers=*",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--profiling=false",
    ]


def scheduler_args(binary: Path, layout: Layout, ports: Ports) -> list[str]:
    return [
        *_controller_flags(binary, layout, ports.scheduler),
        "--profiling=false",
    ]


def kwok_args(binary: Path, layout: Layout, ports: Ports) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={layout.kubeconfig}",
        f"--config={KWOK_STAGES}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
        "--node-lease-duration-seconds=40",
        # Pod IPs of fake nodes, apart from the service range.
        "--cidr=10.244.0.0/16",
        f"--server-address=127.0.0.1:{ports.kwok}",
    ]


def kubeconfig(server: str, pki: Pki, user: str = "admin") -> dict[str, object]:
    """An admin kubeconfig with everything inline, so it keeps working when copied elsewhere."""
    import base64

    def inline(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority-data": inline(pki.ca_cert)}}
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": inline(pki.cert(user)),
                    "client-key-data": inline(pki.key(user)),
                },
            }
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user, "namespace": "default"}}],
        "current-context": "local",
    }


def admin_ssl_context(pki: Pki) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    context.load_cert_chain(str(pki.cert("admin")), str(pki.key("admin")))
    return context


def http_ok(url: str, context: ssl.SSLContext | None = None, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def wait_until(what: str, check: Callable[[], bool], timeout: float, alive: Callable[[], bool] | None = None) -> None:
    deadline = time.monotonic() + timeout
    gone = 0
    while time.monotonic() < deadline:
        if check():
            return
        # Judge a process dead only when it stays so for a second: a single look at /proc can
        # miss a process that is alive (seen under pytest's fd capture).
        gone = gone + 1 if alive is not None and not alive() else 0
        if gone >= 5:
            raise SystemExit(f"cluster: {what}: the process exited; see .cache/cluster/logs/")
        time.sleep(0.2)
    raise SystemExit(f"cluster: {what} not ready after {timeout:.0f}s; see .cache/cluster/logs/")

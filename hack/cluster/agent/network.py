"""A pod's address and the names it resolves: what a CNI plugin and cluster DNS give a real pod.

Every pod the agent runs gets an address of its own in 198.18.0.0/16, `198.18.<node index>.<2..254>`,
reported as `status.podIP`. At start the agent declares that range local, as Linux declares
127.0.0.0/8 (`ip route replace local 198.18.0.0/16 dev lo table local`), so a process listening
on all addresses answers on each. Not 127.x: the API server's pod proxy (`pods/NAME:PORT/proxy`,
what `ftjob upload` goes through) refuses any pod address that is not global unicast ("address
not allowed"), and the EndpointSlice and Endpoints validation refuses loopback addresses.
198.18.0.0/15 is the benchmarking range (RFC 2544), never routed on a real network. The route
stays after the cluster stops (clusters of other checkouts may use it); where it cannot be added
(no CAP_NET_ADMIN) the agent falls back to 127.1.<node>.<host>, and the pod proxy is refused.
The pods share the host's network namespace, so the address names the pod, it does not isolate
it: two pods cannot listen on the same port.

There is no cluster DNS. For a pod with a `subdomain` (the pods of an Indexed Job behind a
headless Service), the agent stands in for it with host entries, as the kubelet writes the pod's
own entry into its /etc/hosts: the pod's /etc/hosts (bind-mounted, read-only, in its mount
namespace) is the host's, plus one line per pod the agent runs in the same namespace and
subdomain, `<ip> <hostname>.<subdomain>.<namespace>.svc.cluster.local <hostname>.<subdomain>`.
The agent rewrites it in place as such pods start and end, so a pod resolves a peer that started
after it, as DNS would once the peer has an address (`publishNotReadyAddresses`). It does not
check that a Service of that name exists.
"""

import logging
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

POD_NETWORK = "198.18.0.0/16"
POD_NETWORK_PREFIX = "198.18"
LOOPBACK_PREFIX = "127.1"
FIRST_HOST, LAST_HOST = 2, 254
CLUSTER_DOMAIN = "svc.cluster.local"
HOSTS_HEADER = "# Pod entries written by the node agent (it stands in for cluster DNS)."


def node_index(node: str) -> int:
    """`local-<i>` -> i."""
    return int(node.rsplit("-", 1)[1])


def route_pod_network() -> str:
    """Make the pod range local to this host; the prefix of the addresses to hand out."""
    command = ["ip", "route", "replace", "local", POD_NETWORK, "dev", "lo", "table", "local"]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        logging.getLogger("node-agent").warning(
            "cannot route %s to this host (%s): pods get 127.1.x addresses, which the pod proxy refuses",
            POD_NETWORK,
            " ".join(str(detail).split()),
        )
        return LOOPBACK_PREFIX
    return POD_NETWORK_PREFIX


class Addresses:
    """One address per running pod, per node; an address is free again once its pod has ended."""

    def __init__(self, prefix: str = POD_NETWORK_PREFIX) -> None:
        self.prefix = prefix
        self._held: dict[str, str] = {}  # pod uid -> address

    def of(self, uid: str) -> str | None:
        return self._held.get(uid)

    def allocate(self, uid: str, node: str, alive: Callable[[str], bool]) -> str:
        if uid in self._held:
            return self._held[uid]
        for held in [u for u in self._held if not alive(u)]:
            del self._held[held]
        taken = set(self._held.values())
        prefix = f"{self.prefix}.{node_index(node)}"
        for host in range(FIRST_HOST, LAST_HOST + 1):
            address = f"{prefix}.{host}"
            if address not in taken:
                self._held[uid] = address
                return address
        raise RuntimeError(f"node {node}: every pod address of {prefix}.0/24 is taken")


@dataclass(frozen=True)
class PodName:
    namespace: str
    hostname: str
    subdomain: str
    address: str

    @property
    def names(self) -> tuple[str, str]:
        short = f"{self.hostname}.{self.subdomain}"
        return f"{short}.{self.namespace}.{CLUSTER_DOMAIN}", short


def pod_name(pod: Mapping[str, Any], address: str) -> PodName | None:
    """The name a pod has behind its subdomain; None for a pod without a subdomain."""
    spec = pod.get("spec") or {}
    subdomain = spec.get("subdomain")
    if not subdomain:
        return None
    meta = pod["metadata"]
    return PodName(meta["namespace"], spec.get("hostname") or meta["name"], subdomain, address)


def hosts_file(base: str, me: PodName, pods: Iterable[PodName]) -> str:
    """`base` (the host's /etc/hosts) and an entry for every pod of `me`'s namespace and subdomain."""
    lines = [base.rstrip("\n"), HOSTS_HEADER]
    peers = {p for p in pods if (p.namespace, p.subdomain) == (me.namespace, me.subdomain)} | {me}
    for peer in sorted(peers, key=lambda p: (p.hostname, p.address)):
        own = f"\t{peer.hostname}" if peer == me else ""
        lines.append(f"{peer.address}\t{peer.names[0]}\t{peer.names[1]}{own}")
    return "\n".join(lines) + "\n"

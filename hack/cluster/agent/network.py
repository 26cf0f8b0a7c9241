"""A pod's address and the names it resolves: what a CNI plugin and cluster DNS give a real pod.

Every pod the agent runs gets an address of its own in 127.0.0.0/8 (Linux routes the whole
block to the loopback interface, so a process listening on all addresses answers on each):
`127.1.<node index>.<2..254>`, reported as `status.podIP`. The pods share the host's network
namespace, so the address names the pod, it does not isolate it: two pods cannot listen on the
same port.

There is no cluster DNS. For a pod with a `subdomain` (the pods of an Indexed Job behind a
headless Service), the agent stands in for it with host entries, as the kubelet writes the pod's
own entry into its /etc/hosts: the pod's /etc/hosts (bind-mounted, read-only, in its mount
namespace) is the host's, plus one line per pod the agent runs in the same namespace and
subdomain, `<ip> <hostname>.<subdomain>.<namespace>.svc.cluster.local <hostname>.<subdomain>`.
The agent rewrites it in place as such pods start and end, so a pod resolves a peer that started
after it, as DNS would once the peer has an address (`publishNotReadyAddresses`). It does not
check that a Service of that name exists.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

POD_NETWORK_PREFIX = "127.1"
FIRST_HOST, LAST_HOST = 2, 254
CLUSTER_DOMAIN = "svc.cluster.local"
HOSTS_HEADER = "# Pod entries written by the node agent (it stands in for cluster DNS)."


def node_index(node: str) -> int:
    """`local-<i>` -> i."""
    return int(node.rsplit("-", 1)[1])


class Addresses:
    """One address per running pod, per node; an address is free again once its pod has ended."""

    def __init__(self) -> None:
        self._held: dict[str, str] = {}  # pod uid -> address

    def of(self, uid: str) -> str | None:
        return self._held.get(uid)

    def allocate(self, uid: str, node: str, alive: Callable[[str], bool]) -> str:
        if uid in self._held:
            return self._held[uid]
        for held in [u for u in self._held if not alive(u)]:
            del self._held[held]
        taken = set(self._held.values())
        prefix = f"{POD_NETWORK_PREFIX}.{node_index(node)}"
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

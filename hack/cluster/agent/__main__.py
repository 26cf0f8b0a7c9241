"""Run the node agent: `python -m hack.cluster.agent` (started by `python -m hack.cluster up`)."""

import dataclasses
import logging
import queue
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from ..control_plane import ClusterState
from ..layout import LOCAL_NODES, Layout
from .kube import Kube
from .logs_server import serve as serve_logs
from .network import Addresses, PodName, hosts_file, pod_name, route_pod_network
from .node import heartbeat, register
from .pod_status import Terminated, now, pod_status
from .runner import NodeContext, PodRun, pod_dir_name

HOST_HOSTS = Path("/etc/hosts")

log = logging.getLogger("node-agent")

# Containers still running when the agent itself is stopped get this long after SIGTERM.
SHUTDOWN_GRACE = 5.0


def _watch_pods(
    kube: Kube, node: str, events: "queue.Queue[tuple[str, dict[str, Any]]]", stop: threading.Event
) -> None:
    """List, then watch, the node's pods forever; a relist after each watch ends repairs missed events."""
    selector = f"spec.nodeName={node}"
    while not stop.is_set():
        try:
            listed = kube.plain(kube.core.list_pod_for_all_namespaces(field_selector=selector))
            for pod in listed["items"]:
                events.put(("SYNC", pod))
            stream = watch.Watch().stream(
                kube.core.list_pod_for_all_namespaces,
                field_selector=selector,
                resource_version=listed["metadata"]["resourceVersion"],
                timeout_seconds=60,
            )
            for event in stream:
                events.put((event["type"], kube.plain(event["object"])))
                if stop.is_set():
                    return
        except Exception as err:
            log.warning("pod watch failed: %s", err)
            stop.wait(1)


class Agent:
    """The kubelet of every node in LOCAL_NODES: one context per node, one address per pod."""

    def __init__(self, ctx: NodeContext, nodes: tuple[str, ...] = (LOCAL_NODES[0],)) -> None:
        self.ctx = ctx
        self.contexts = {node: dataclasses.replace(ctx, node=node) for node in nodes}
        self.runs: dict[str, PodRun] = {}
        self.addresses = Addresses(route_pod_network())
        self.names: dict[str, PodName] = {}  # uid -> the name of a pod with a subdomain
        self._hosts_written: dict[str, str] = {}
        try:
            self.base_hosts = HOST_HOSTS.read_text()
        except OSError:
            self.base_hosts = "127.0.0.1\tlocalhost\n"

    def _alive(self, uid: str) -> bool:
        run = self.runs.get(uid)
        return run is not None and (run.is_alive() or not run.ident)

    def _start(self, pod: dict[str, Any]) -> PodRun:
        meta = pod["metadata"]
        node = pod["spec"].get("nodeName") or self.ctx.node
        ctx = self.contexts.get(node, self.ctx)
        address = self.addresses.allocate(meta["uid"], node, self._alive)
        name = pod_name(pod, address)
        hosts = None
        if name is not None:
            hosts = ctx.layout.pods / pod_dir_name(pod) / "etc-hosts"
            hosts.parent.mkdir(parents=True, exist_ok=True)
            self.names[meta["uid"]] = name
        run = PodRun(ctx, pod, address, hosts)
        self.runs[meta["uid"]] = run
        self.refresh_hosts()
        return run

    def refresh_hosts(self) -> None:
        """Rewrite, in place, the hosts file of each running pod with a subdomain whose peers changed."""
        for uid in [u for u in self.names if not self._alive(u)]:
            del self.names[uid]
            self._hosts_written.pop(uid, None)
        for uid, me in self.names.items():
            run = self.runs[uid]
            if run.hosts is None:
                continue
            text = hosts_file(self.base_hosts, me, self.names.values())
            if self._hosts_written.get(uid) != text:
                # In place: the pod's bind mount holds this inode (a rename would not reach it).
                run.hosts.write_text(text)
                self._hosts_written[uid] = text

    def handle(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        run = self.runs.get(uid)
        deleting = meta.get("deletionTimestamp") is not None
        if kind == "DELETED":
            if run is not None:
                run.request_stop(0)
            return
        if run is not None:
            if deleting:
                if run.is_alive():
                    run.request_stop(meta.get("deletionGracePeriodSeconds"))
                else:
                    self.ctx.kube.delete_pod_now(meta["namespace"], meta["name"], uid)
            return
        phase = (pod.get("status") or {}).get("phase", "Pending")
        if deleting:
            self.ctx.kube.delete_pod_now(meta["namespace"], meta["name"], uid)
        elif phase == "Running":
            self._orphaned(pod)
        elif phase == "Pending":
            run = self._start(pod)
            run.start()
            log.info("pod %s/%s: started", meta["namespace"], meta["name"])

    def _orphaned(self, pod: dict[str, Any]) -> None:
        """A pod Running here that this agent never started: its process died with an earlier agent."""
        stamp = now()
        lost = Terminated(137, "ContainerStatusUnknown", "the node agent restarted; the process is gone", stamp, stamp)
        status = pod_status(pod, "Failed", [], [lost] * len(pod["spec"]["containers"]), start_time=stamp)
        self.ctx.kube.patch_pod_status(pod["metadata"]["namespace"], pod["metadata"]["name"], status)

    def shutdown(self) -> None:
        for run in self.runs.values():
            run.request_stop(SHUTDOWN_GRACE)
        for run in self.runs.values():
            run.join(SHUTDOWN_GRACE + 10)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(threadName)s %(message)s")
    layout = Layout.for_repo()
    state = ClusterState.load(layout.state)
    config.load_kube_config(str(layout.kubeconfig))
    kube = Kube(client.ApiClient())
    port = state.ports.node_agent
    serve_logs(layout, port)
    nodes = [register(kube, name, port) for name in LOCAL_NODES]
    ctx = NodeContext(
        layout=layout,
        kube=kube,
        node=LOCAL_NODES[0],
        api_port=state.ports.apiserver,
        allocatable=nodes[0]["status"]["allocatable"],
    )
    agent = Agent(ctx, LOCAL_NODES)
    stop = threading.Event()
    events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for node in nodes:
        name = node["metadata"]["name"]
        threading.Thread(target=heartbeat, args=(kube, node, port, stop), name=f"heartbeat-{name}", daemon=True).start()
        threading.Thread(target=_watch_pods, args=(kube, name, events, stop), name=f"watch-{name}", daemon=True).start()
    log.info("nodes %s ready", ", ".join(LOCAL_NODES))
    while not stop.is_set():
        try:
            kind, pod = events.get(timeout=0.5)
        except queue.Empty:
            agent.refresh_hosts()  # peers that ended
            continue
        try:
            agent.handle(kind, pod)
        except Exception:
            log.exception("handling %s %s/%s", kind, pod["metadata"].get("namespace"), pod["metadata"].get("name"))
    agent.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run the node agent: `python -m hack.cluster.agent` (started by `python -m hack.cluster up`)."""

import logging
import queue
import signal
import sys
import threading
from typing import Any

from kubernetes import client, config, watch

from ..control_plane import ClusterState
from ..layout import LOCAL_NODE, Layout
from .kube import Kube
from .logs_server import serve as serve_logs
from .node import heartbeat, register
from .pod_status import Terminated, now, pod_status
from .runner import NodeContext, PodRun

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
    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.runs: dict[str, PodRun] = {}

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
            run = PodRun(self.ctx, pod)
            self.runs[uid] = run
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
    node = register(kube, LOCAL_NODE, port)
    ctx = NodeContext(
        layout=layout,
        kube=kube,
        node=LOCAL_NODE,
        api_port=state.ports.apiserver,
        allocatable=node["status"]["allocatable"],
    )
    agent = Agent(ctx)
    stop = threading.Event()
    events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=heartbeat, args=(kube, node, port, stop), name="heartbeat", daemon=True).start()
    threading.Thread(target=_watch_pods, args=(kube, LOCAL_NODE, events, stop), name="watch", daemon=True).start()
    log.info("node %s ready", LOCAL_NODE)
    while not stop.is_set():
        try:
            kind, pod = events.get(timeout=0.5)
        except queue.Empty:
            continue
        try:
            agent.handle(kind, pod)
        except Exception:
            log.exception("handling %s %s/%s", kind, pod["metadata"].get("namespace"), pod["metadata"].get("name"))
    agent.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

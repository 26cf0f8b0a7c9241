"""`ftjob logs NAME [-f] [--rank N]`: the trainer output of the job's current attempt (its newest
pod; for a job of several nodes, the newest pod of node rank N, 0 unless asked).

Reads through the standard pod log API (the kubelet serves it). Where no kubelet serves logs,
as on a development control plane whose node agent runs pods as local processes, `--logs-dir`
(or $FTJOB_POD_LOGS_DIR) names the agent's folder of `<namespace>_<pod>_<uid>/<container>.log`
files, and the logs are read from there.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from finetune_api.constants import LABEL_COMPONENT, LABEL_JOB
from finetune_api.contract import COMPONENT_TRAINER, CONTAINER, TERMINAL_PHASES
from finetune_api.multinode import COMPLETION_INDEX_ANNOTATION

from . import kube
from .errors import CliError

POLL_SECONDS = 0.5
API_TIMEOUT_SECONDS = 15


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "logs",
        help="print the trainer's logs",
        description="Print the logs of the job's current attempt (its newest trainer pod).",
    )
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing until the pod ends")
    parser.add_argument("-c", "--container", help=f"container (default: {CONTAINER})")
    parser.add_argument(
        "--rank",
        type=int,
        metavar="N",
        help="for a job of several nodes: the pod of node rank N (its completion index; default 0)",
    )
    parser.add_argument(
        "--logs-dir",
        metavar="DIR",
        default=os.environ.get("FTJOB_POD_LOGS_DIR"),
        help="folder of local pod logs, for clusters without a kubelet log endpoint ($FTJOB_POD_LOGS_DIR)",
    )
    kube.add_options(parser)
    parser.set_defaults(handler=run)


def _created(pod: Any) -> float:
    stamp = pod.metadata.creation_timestamp
    return stamp.timestamp() if stamp is not None else 0.0


def node_rank(pod: Any) -> int:
    """The pod's node rank: its Indexed Job completion index; a one-node job's pod is rank 0."""
    return int((pod.metadata.annotations or {}).get(COMPLETION_INDEX_ANNOTATION, "0"))


def current_pod(cluster: kube.Cluster, name: str, rank: int = 0) -> Any | None:
    with kube.api_errors(cluster, f"pods of finetunejob {name}"):
        pods = cluster.core().list_namespaced_pod(cluster.namespace, label_selector=f"{LABEL_JOB}={name}").items
    trainers = [
        p
        for p in pods
        if (p.metadata.labels or {}).get(LABEL_COMPONENT, COMPONENT_TRAINER) == COMPONENT_TRAINER
        and node_rank(p) == rank
    ]
    return max(trainers, key=_created, default=None)


def _rank(job: dict[str, Any], wanted: int | None) -> int:
    nodes = int(((job.get("spec") or {}).get("resources") or {}).get("nodes") or 1)
    rank = 0 if wanted is None else wanted
    if not 0 <= rank < nodes:
        raise CliError(f"--rank {rank}: finetunejob {job['metadata']['name']} has node ranks 0 to {nodes - 1}")
    return rank


def _container(pod: Any, wanted: str | None) -> str:
    names = [c.name for c in pod.spec.containers]
    if wanted:
        if wanted not in names:
            raise CliError(f"pod {pod.metadata.name} has no container {wanted} (it has {', '.join(names)})")
        return wanted
    return CONTAINER if CONTAINER in names else names[0]


def _wait_for_pod(cluster: kube.Cluster, name: str, rank: int, follow: bool) -> Any:
    while True:
        pod = current_pod(cluster, name, rank)
        if pod is not None:
            return pod
        phase = (kube.get_job(cluster, name).get("status") or {}).get("phase") or "Pending"
        if not follow or phase in TERMINAL_PHASES:
            which = f" of rank {rank}" if rank else ""
            raise CliError(f"finetunejob {name} has no trainer pod{which} (phase {phase})")
        time.sleep(POLL_SECONDS * 2)


def _local_log(logs_dir: str | None, pod: Any, container: str) -> Path | None:
    if not logs_dir:
        return None
    path = Path(logs_dir) / f"{pod.metadata.namespace}_{pod.metadata.name}_{pod.metadata.uid}" / f"{container}.log"
    return path if path.is_file() else None


def _pod_done(cluster: kube.Cluster, pod: Any) -> bool:
    with kube.api_errors(cluster, f"pod {pod.metadata.name}"):
        fresh = cluster.core().read_namespaced_pod(pod.metadata.name, cluster.namespace)
    return fresh.status.phase in TERMINAL_PHASES


def _tail_file(cluster: kube.Cluster, pod: Any, path: Path, follow: bool) -> None:
    with path.open("rb") as source:
        while True:
            chunk = source.read()
            if chunk:
                sys.stdout.write(chunk.decode("utf-8", errors="replace"))
                sys.stdout.flush()
            if not follow:
                return
            if not chunk and _pod_done(cluster, pod):
                rest = source.read()
                sys.stdout.write(rest.decode("utf-8", errors="replace"))
                return
            time.sleep(POLL_SECONDS)


def _from_api(cluster: kube.Cluster, pod: Any, container: str, follow: bool) -> None:
    from kubernetes import watch as watch_module

    watch: Any = watch_module  # untyped in the client

    core = cluster.core()
    if not follow:
        text = core.read_namespaced_pod_log(
            pod.metadata.name, cluster.namespace, container=container, _request_timeout=API_TIMEOUT_SECONDS
        )
        sys.stdout.write(text if isinstance(text, str) else str(text))
        return
    for line in watch.Watch().stream(
        core.read_namespaced_pod_log, pod.metadata.name, cluster.namespace, container=container
    ):
        print(line, flush=True)


def run(args: argparse.Namespace) -> int:
    cluster = kube.connect(args)
    job = kube.get_job(cluster, args.name)  # a clear "not found" before looking for pods
    pod = _wait_for_pod(cluster, args.name, _rank(job, args.rank), args.follow)
    container = _container(pod, args.container)
    try:
        with kube.api_errors(cluster, f"logs of pod {pod.metadata.name}"):
            _from_api(cluster, pod, container, args.follow)
        return 0
    except CliError:
        # No kubelet answered for the node: use the node agent's files when they are there.
        local = _local_log(args.logs_dir, pod, container)
        if local is None:
            raise
    _tail_file(cluster, pod, local, args.follow)
    return 0

"""The pod's command when the job needs more than one process: PyTorch's launcher, one worker per GPU.

`python -m finetune_trainer --config FILE` decides the launch once (`launch_plan.decide_pod`).
One process trains in place; more are started by torch.distributed.run's elastic agent (the
engine of `torchrun --standalone`), each running `python -m finetune_trainer --config FILE
--worker`, with NCCL on GPUs and gloo on the CPU; the launcher hands its decision down to them
(`launch_plan.hand_down`), so no worker decides again. The agent stops every worker when one
fails, and forwards SIGTERM to them.

The launcher alone would end with its generic exit 1. Each worker that fails with a reason it
can name writes it to a file in a folder the launcher gives it (`REASON_DIR_ENV`); the pod then
exits with the reason of the rank that failed first, and writes its `Reason: message`. A rank
killed by a signal, which writes nothing, is named in a retryable TrainerError.

A job of several nodes (`resources.nodes` > 1: one pod per node, an Indexed Job) runs one such
launcher per pod, settings from the environment the Job sets (`finetune_api.multinode`): they meet
at a c10d rendezvous served by the launcher of the pod of index 0, which is global rank 0 (the
one that writes). A launcher that does not meet every node within the bound exits
RendezvousTimeout instead of waiting forever.

Every worker also registers its pid there and marks a finished run. The agent learns a worker's
end from its exit status alone, and an exit status can be lost (a child reaped by someone else
reads as 0 to `subprocess`): the agent would then wait on the other ranks, which wait on the
lost one in a collective for the whole collective timeout. So a watchdog beside the agent looks
for a registered worker that is gone without a finish mark or a reason; it records it and stops
the others, and a run the agent calls a success counts only if every rank marked its finish.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_api import multinode
from finetune_api.reasons import ExitReason

from ..failures import TrainerFailure
from ..training.launch_plan import Decision, hand_down

log = logging.getLogger(__name__)

REASON_DIR_ENV = "FINETUNE_REASON_DIR"
WORKER_FLAG = "--worker"
# How often the agent looks at its workers; a failed rank's peers are stopped within this.
MONITOR_INTERVAL_S = 0.5
# A worker gone this long with no account of its end was lost to the agent: it would have acted.
VANISHED_AFTER_S = 5.0
PR_SET_PDEATHSIG = 1  # prctl(2)


@dataclass(frozen=True)
class RankFailure:
    rank: int
    reason: ExitReason
    message: str
    time: float
    vanished: bool = False  # recorded by the watchdog, not by the rank itself


@dataclass(frozen=True)
class Nodes:
    """This pod's place in a job of several nodes, from the environment the Indexed Job sets."""

    count: int
    rank: int
    endpoint: str
    local_addr: str | None
    timeout_s: int

    @property
    def hosts_rendezvous(self) -> bool:
        return self.rank == 0


def _env_int(values: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = values.get(name)
    if raw is None or raw == "":
        if default is None:
            raise TrainerFailure(ExitReason.InvalidConfig, f"{name} is not set (a pod of a multi-node job needs it)")
        return default
    try:
        return int(raw)
    except ValueError:
        raise TrainerFailure(ExitReason.InvalidConfig, f"{name}: expected an integer, got {raw!r}") from None


def nodes_from_env(env: Mapping[str, str] | None = None) -> Nodes | None:
    """The multi-node settings, or None for a job of one node (no FINETUNE_NNODES, or 1)."""
    values = os.environ if env is None else env
    count = _env_int(values, multinode.NNODES_ENV, 1)
    if count == 1:
        return None
    rank = _env_int(values, multinode.NODE_RANK_ENV)
    if count < 1 or not 0 <= rank < count:
        raise TrainerFailure(
            ExitReason.InvalidConfig,
            f"node rank {rank} ({multinode.NODE_RANK_ENV}) is outside 0..{count - 1} ({multinode.NNODES_ENV})",
        )
    endpoint = values.get(multinode.RDZV_ENDPOINT_ENV, "")
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise TrainerFailure(
            ExitReason.InvalidConfig, f"{multinode.RDZV_ENDPOINT_ENV}: expected host:port, got {endpoint!r}"
        )
    timeout_s = _env_int(values, multinode.RDZV_TIMEOUT_ENV, multinode.DEFAULT_RDZV_TIMEOUT_S)
    if timeout_s < 1:
        raise TrainerFailure(ExitReason.InvalidConfig, f"{multinode.RDZV_TIMEOUT_ENV}: expected 1 or more seconds")
    return Nodes(count, rank, endpoint, _local_addr(values), timeout_s)


def _local_addr(values: Mapping[str, str]) -> str | None:
    """How the other nodes reach this one: `<hostname>.<subdomain>` in a pod.

    c10d numbers the nodes in the order of these addresses, so they also decide the node ranks:
    every pod's is `<job>-<index>.<subdomain>`, and `<job>-0.` sorts before `<job>-<1..9>...`,
    which makes the pod of index 0 (the Job's success, through its successPolicy) global rank 0.
    """
    explicit = values.get(multinode.NODE_ADDR_ENV)
    if explicit:
        return explicit
    domain = values.get(multinode.NODE_DOMAIN_ENV)
    if not domain:
        return None
    import socket

    # A container's HOSTNAME is its pod's hostname; the local node agent sets it the same way.
    return f"{values.get('HOSTNAME') or socket.gethostname()}.{domain}"


def check_placement(env: Mapping[str, str] | None = None) -> None:
    """In a worker: global rank 0 runs in the pod of index 0, whose success ends the Job."""
    values = os.environ if env is None else env
    nodes = nodes_from_env(values)
    if nodes is None:
        return
    group = int(values.get("GROUP_RANK", "-1"))
    if (int(values.get("RANK", "0")) == 0) != (nodes.rank == 0):
        raise TrainerFailure(
            ExitReason.TrainerError,
            f"the rendezvous made node {group} of the pod of index {nodes.rank} hold rank 0; only the pod "
            "of index 0 may (its success completes the Job)",
        )


def die_with_launcher() -> None:
    """Make this worker die with the launcher that started it (Linux).

    The launcher puts each worker in a session of its own; in a pod the container's end takes
    them all, but a launcher killed on its own (or a plain process tree on a laptop) would leave
    workers holding GPU memory and waiting on collectives for half an hour.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    launcher = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher:  # it ended before the request took effect
        os._exit(int(ExitReason.TrainerError))


def _worker_file(suffix: str) -> tuple[int, Path] | None:
    folder = os.environ.get(REASON_DIR_ENV)
    if not folder:
        return None
    rank = int(os.environ.get("RANK", "0"))
    return rank, Path(folder) / f"rank-{rank}.{suffix}"


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        log.warning("cannot write %s: %s", path, exc)


def register_worker() -> None:
    """Called by a worker as it starts, so the watchdog can tell when it is gone."""
    if found := _worker_file("pid"):
        _write(found[1], str(os.getpid()))


def record_done() -> None:
    """Called by a worker whose training ended well, just before it exits 0."""
    if found := _worker_file("done"):
        _write(found[1], "")


def write_reason(reason: ExitReason, message: str) -> None:
    """Called by a worker that is about to exit with `reason` (no-op outside the launcher)."""
    if found := _worker_file("json"):
        rank, path = found
        _write(path, json.dumps({"rank": rank, "reason": reason.name, "message": message, "time": time.time()}))


def read_reasons(folder: Path) -> list[RankFailure]:
    found: list[RankFailure] = []
    for path in sorted(folder.glob("rank-*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            found.append(
                RankFailure(
                    int(data["rank"]),
                    ExitReason[data["reason"]],
                    str(data["message"]),
                    float(data["time"]),
                    bool(data.get("vanished", False)),
                )
            )
        except (OSError, ValueError, KeyError) as exc:
            log.warning("unreadable failure record %s: %s", path, exc)
    return sorted(found, key=lambda f: f.time)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def root_cause(reasons: list[RankFailure], exit_codes: dict[int, int]) -> tuple[ExitReason, str]:
    """The pod's reason: the first named failure that is not a mere consequence of another rank's
    end; else a rank the watchdog found gone; else a rank killed by a signal; else the first
    named failure; else the exit codes."""
    named = [r for r in reasons if r.reason != ExitReason.TrainerError]
    if named:
        # Ranks that met the same end alike: rank 0's account is the one that knows most
        # (it wrote the checkpoint, it timed the stop).
        first = min((r for r in named if r.reason == named[0].reason), key=lambda r: r.rank)
        return first.reason, f"rank {first.rank}: {first.message}"
    vanished = [r for r in reasons if r.vanished]
    if vanished:
        return vanished[0].reason, vanished[0].message
    killed = sorted(rank for rank, code in exit_codes.items() if code < 0 and rank not in {r.rank for r in reasons})
    if killed:
        rank = killed[0]
        return (
            ExitReason.TrainerError,
            f"rank {rank} was killed by {_signal_name(exit_codes[rank])}; the job resumes from its last checkpoint",
        )
    if reasons:
        first = reasons[0]
        return first.reason, f"rank {first.rank}: {first.message}"
    codes = ", ".join(f"rank {rank} exited {code}" for rank, code in sorted(exit_codes.items()))
    return ExitReason.TrainerError, f"a training process failed ({codes or 'no exit code'})"


def record_lost(folder: Path, rank: int, how: str) -> None:
    """Record, for a rank that could not, that it ended unaccounted for (a retryable failure)."""
    message = f"rank {rank} {how}; the job resumes from its last checkpoint"
    log.error("%s", message)
    record = {"rank": rank, "reason": "TrainerError", "message": message, "time": time.time(), "vanished": True}
    _write(folder / f"rank-{rank}.json", json.dumps(record))


def _gone(pid: int) -> bool:
    """True once the process has ended and been reaped (a zombie is the agent's to collect)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def child_processes() -> list[int]:
    """The pids of this process's children (the agent's workers, once it starts them)."""
    found: list[int] = []
    for task in Path("/proc/self/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            found.extend(int(pid) for pid in task.read_text(encoding="utf-8").split())
    return found


class Watchdog:
    """Beside the agent: finds a worker that ended with no finish mark and no reason, records
    it as a retryable failure, and kills the other workers so that the agent ends the run."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.found: int | None = None
        self._first_seen_gone: dict[int, float] = {}

    def workers(self) -> dict[int, int]:
        """rank -> pid of every registered worker."""
        found: dict[int, int] = {}
        for path in self.folder.glob("rank-*.pid"):
            try:
                found[int(path.stem.removeprefix("rank-"))] = int(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # being written
        return found

    def accounted(self, rank: int) -> bool:
        return (self.folder / f"rank-{rank}.done").exists() or (self.folder / f"rank-{rank}.json").exists()

    def check(self, now: float) -> int | None:
        """One look: the rank found lost (recorded, its peers killed), or None. Acts once."""
        if self.found is not None:
            return None
        workers = self.workers()
        for rank, pid in sorted(workers.items()):
            if not _gone(pid) or self.accounted(rank):
                self._first_seen_gone.pop(rank, None)
                continue
            since = self._first_seen_gone.setdefault(rank, now)
            if now - since < VANISHED_AFTER_S:
                continue
            record_lost(self.folder, rank, "ended without finishing or naming a reason (killed, its exit status lost)")
            for other, other_pid in workers.items():
                if other != rank and not _gone(other_pid):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(other_pid, signal.SIGKILL)  # each worker leads a session of its own
            self.found = rank
            return rank
        return None

    def forward(self, signum: int, told: set[int]) -> None:
        """Pass a signal to every registered worker not yet told."""
        for rank, pid in self.workers().items():
            if rank in told:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
            told.add(rank)


def pod_ranks(folder: Path, processes: int) -> range:
    """The global ranks of this pod's workers: a node's ranks are consecutive, node by node."""
    registered = []
    for path in folder.glob("rank-*.pid"):
        with contextlib.suppress(ValueError):
            registered.append(int(path.stem.removeprefix("rank-")))
    first = min(registered) // processes * processes if registered else 0
    return range(first, first + processes)


def unfinished(folder: Path, processes: int) -> list[int]:
    """Ranks with no finish mark: after a run the agent called a success, there must be none."""
    return [rank for rank in pod_ranks(folder, processes) if not (folder / f"rank-{rank}.done").exists()]


def launch_config(processes: int, nodes: Nodes | None) -> dict[str, Any]:
    """The elastic agent's settings: `--standalone` for one node, else the job's c10d rendezvous."""
    common: dict[str, Any] = {
        "nproc_per_node": processes,
        "rdzv_backend": "c10d",
        "max_restarts": 0,  # a failed attempt is the Job's to retry, from the last checkpoint
        "monitor_interval": MONITOR_INTERVAL_S,
    }
    if nodes is None:
        # `--standalone`: a store on a free local port.
        return common | {"min_nodes": 1, "max_nodes": 1, "run_id": str(uuid.uuid4()), "rdzv_endpoint": "localhost:0"}
    return common | {
        "min_nodes": nodes.count,
        "max_nodes": nodes.count,
        # One rendezvous per attempt: its store lives in the launcher of the pod of index 0.
        "run_id": "finetune",
        "rdzv_endpoint": nodes.endpoint,
        "local_addr": nodes.local_addr,
        "rdzv_configs": {
            # Only the pod of index 0 serves the store; the others wait for it to listen. The
            # bound: pod 0 waits `timeout_s` for every node to join; another pod waits up to
            # `timeout_s` for pod 0's store to listen, then up to `timeout_s` to join (2x at most).
            "is_host": nodes.hosts_rendezvous,
            "join_timeout": nodes.timeout_s,
            "read_timeout": nodes.timeout_s,
            "last_call_timeout": 1,
        },
    }


def launch(config_path: str, processes: int, decision: Decision) -> tuple[ExitReason | None, str]:
    """Run `processes` workers to their end; (None, "") on success, else the pod's reason and message.

    With several nodes (`finetune_api.multinode`'s environment), the workers of every pod form
    one world of nodes x processes ranks.

    The agent runs in a thread of its own, because from the main thread torch installs signal
    handlers that turn SIGTERM into an exception and kill every worker 30 s later, whatever the
    pod's grace period. Here the main thread keeps SIGTERM (and SIGINT): it passes it on to
    each worker, which stops at the next micro-batch boundary with a checkpoint, and the agent
    then sees them end with their own reason. The main thread also runs the watchdog. The
    workers train `decision`, the launch this launcher decided (`launch_plan.receive`).
    """
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    nodes = nodes_from_env()
    with tempfile.TemporaryDirectory(prefix="finetune-ranks-") as folder:
        os.environ[REASON_DIR_ENV] = folder
        hand_down(decision, Path(folder))
        settings = LaunchConfig(**launch_config(processes, nodes))
        if nodes is not None:
            log.info(
                "node %d of %d: rendezvous at %s as %s, %d s at most",
                nodes.rank,
                nodes.count,
                nodes.endpoint,
                nodes.local_addr or "this host",
                nodes.timeout_s,
            )
        ended: list[BaseException] = []

        def run_agent() -> None:
            try:
                elastic_launch(settings, sys.executable)("-m", "finetune_trainer", "--config", config_path, WORKER_FLAG)
            except BaseException as exc:  # handed to the main thread as it is
                ended.append(exc)

        watchdog = Watchdog(Path(folder))
        signals: list[int] = []
        told: set[int] = set()

        def on_signal(signum: int, _frame: object) -> None:
            if not signals:
                log.warning("%s: passing it on to every rank", signal.Signals(signum).name)
            signals.append(signum)

        # An inherited "ignore SIGCHLD" makes the kernel reap workers, and every exit read as 0.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        # A daemon: a launcher stopped at the rendezvous leaves without it (above).
        agent = threading.Thread(target=run_agent, name="elastic-agent", daemon=True)
        try:
            agent.start()
            while agent.is_alive():
                agent.join(MONITOR_INTERVAL_S)
                if signals:
                    # Workers that register later (still starting) are told as they appear.
                    watchdog.forward(signal.SIGTERM, told)
                    if not watchdog.workers() and not child_processes():
                        # No worker was ever started: the agent is still at (or before) the
                        # rendezvous, where it may wait out the whole bound for peers that will
                        # not come (a gang being deleted). Nothing has trained, so nothing is
                        # lost: leave now, retryably, without waiting for that thread.
                        stopped = signal.Signals(signals[0]).name
                        return ExitReason.Interrupted, f"{stopped} before any rank started training; nothing to save"
                watchdog.check(time.monotonic())
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return _verdict(Path(folder), processes, ended[0] if ended else None, nodes)
    return None, ""


def _verdict(
    folder: Path, processes: int, error: BaseException | None, nodes: Nodes | None = None
) -> tuple[ExitReason | None, str]:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousTimeoutError

    if isinstance(error, (RendezvousTimeoutError, RendezvousConnectionError)) and nodes is not None:
        first = " ".join(str(error).split())[:300]
        return ExitReason.RendezvousTimeout, (
            f"node {nodes.rank} of {nodes.count} did not meet every node at {nodes.endpoint} within "
            f"{nodes.timeout_s} s ({type(error).__name__}: {first}); the job retries from its last checkpoint"
        )
    if error is not None and not isinstance(error, ChildFailedError):
        raise error
    codes = {rank: failure.exitcode for rank, failure in error.failures.items()} if error is not None else {}
    recorded = {r.rank for r in read_reasons(folder)}
    for rank in unfinished(folder, processes):
        # Exit 0 without a finish mark: the rank the others then failed waiting on.
        if rank not in codes and rank not in recorded:
            record_lost(folder, rank, "exited before its training ended")
    reasons = read_reasons(folder)
    if error is None and not reasons:
        return None, ""
    return root_cause(reasons, codes)

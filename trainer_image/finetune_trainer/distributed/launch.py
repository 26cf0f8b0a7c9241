"""The pod's command when the job needs more than one process: PyTorch's launcher, one worker per GPU.

`python -m finetune_trainer --config FILE` decides the launch (`launch_plan.decide`). One
process trains in place; more are started by torch.distributed.run's elastic agent (the engine
of `torchrun --standalone`), each running `python -m finetune_trainer --config FILE --worker`,
with NCCL on GPUs and gloo on the CPU. The agent stops every worker when one fails, and
forwards SIGTERM to them.

The launcher alone would end with its generic exit 1. Each worker that fails with a reason it
can name writes it to a file in a folder the launcher gives it (`REASON_DIR_ENV`); the pod then
exits with the reason of the rank that failed first, and writes its `Reason: message`. A rank
killed by a signal, which writes nothing, is named in a retryable TrainerError.

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
from dataclasses import dataclass
from pathlib import Path

from finetune_api.reasons import ExitReason

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


def unfinished(folder: Path, processes: int) -> list[int]:
    """Ranks with no finish mark: after a run the agent called a success, there must be none."""
    return [rank for rank in range(processes) if not (folder / f"rank-{rank}.done").exists()]


def launch(config_path: str, processes: int) -> tuple[ExitReason | None, str]:
    """Run `processes` workers to their end; (None, "") on success, else the pod's reason and message.

    The agent runs in a thread of its own, because from the main thread torch installs signal
    handlers that turn SIGTERM into an exception and kill every worker 30 s later, whatever the
    pod's grace period. Here the main thread keeps SIGTERM (and SIGINT): it passes it on to
    each worker, which stops at the next micro-batch boundary with a checkpoint, and the agent
    then sees them end with their own reason. The main thread also runs the watchdog.
    """
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    with tempfile.TemporaryDirectory(prefix="finetune-ranks-") as folder:
        os.environ[REASON_DIR_ENV] = folder
        settings = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=processes,
            run_id=str(uuid.uuid4()),
            rdzv_backend="c10d",
            rdzv_endpoint="localhost:0",  # `--standalone`: a store on a free local port
            max_restarts=0,  # a failed attempt is the Job's to retry, from the last checkpoint
            monitor_interval=MONITOR_INTERVAL_S,
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
        agent = threading.Thread(target=run_agent, name="elastic-agent")
        try:
            agent.start()
            while agent.is_alive():
                agent.join(MONITOR_INTERVAL_S)
                if signals:
                    # Workers that register later (still starting) are told as they appear.
                    watchdog.forward(signal.SIGTERM, told)
                watchdog.check(time.monotonic())
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return _verdict(Path(folder), processes, ended[0] if ended else None)
    return None, ""


def _verdict(folder: Path, processes: int, error: BaseException | None) -> tuple[ExitReason | None, str]:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

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

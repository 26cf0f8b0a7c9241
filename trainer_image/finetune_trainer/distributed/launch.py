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
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
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
PR_SET_PDEATHSIG = 1  # prctl(2)


@dataclass(frozen=True)
class RankFailure:
    rank: int
    reason: ExitReason
    message: str
    time: float


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


def write_reason(reason: ExitReason, message: str) -> None:
    """Called by a worker that is about to exit with `reason` (no-op outside the launcher)."""
    folder = os.environ.get(REASON_DIR_ENV)
    if not folder:
        return
    rank = int(os.environ.get("RANK", "0"))
    record = {"rank": rank, "reason": reason.name, "message": message, "time": time.time()}
    path = Path(folder) / f"rank-{rank}.json"
    try:
        path.write_text(json.dumps(record), encoding="utf-8")
    except OSError as exc:
        log.warning("cannot record rank %d's failure in %s: %s", rank, path, exc)


def read_reasons(folder: Path) -> list[RankFailure]:
    found: list[RankFailure] = []
    for path in sorted(folder.glob("rank-*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            found.append(
                RankFailure(int(data["rank"]), ExitReason[data["reason"]], str(data["message"]), float(data["time"]))
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
    end; else a rank killed by a signal; else the first named failure; else the exit codes."""
    named = [r for r in reasons if r.reason != ExitReason.TrainerError]
    if named:
        first = named[0]
        return first.reason, f"rank {first.rank}: {first.message}"
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


def launch(config_path: str, processes: int) -> tuple[ExitReason | None, str]:
    """Run `processes` workers to their end; (None, "") on success, else the pod's reason and message."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
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
        try:
            elastic_launch(settings, sys.executable)("-m", "finetune_trainer", "--config", config_path, WORKER_FLAG)
        except ChildFailedError as failed:
            codes = {rank: failure.exitcode for rank, failure in failed.failures.items()}
            return root_cause(read_reasons(Path(folder)), codes)
        except SignalException as stopped:
            # SIGTERM (suspend, preemption, drain): the agent has passed it on to every worker.
            return (
                ExitReason.TrainerError,
                f"stopped by {stopped.sigval.name}; the job resumes from its last checkpoint",
            )
    return None, ""

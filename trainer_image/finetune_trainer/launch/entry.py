"""Command line of the trainer: read the config, run, and always leave a reason behind.

Every ending maps to an exit code and a `Reason: message` line in the termination log (the
operator's podFailurePolicy and status logic read both). A user's mistake is one line; only
a bug in the trainer itself prints a traceback, to the log, for whoever fixes it.
"""

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from pydantic import ValidationError

from finetune_api.contract import CHECK_INPUTS_FLAG, EXPORT_ONLY_FLAG, FETCH_INPUTS_FLAG
from finetune_api.problems import problems_from
from finetune_api.reasons import TERMINATION_LOG, ExitReason, export_failed_message, termination_message
from finetune_api.trainer_config import TrainerConfig

from .. import faults
from ..failures import TrainerFailure

if TYPE_CHECKING:
    from ..training.launch_plan import Decision

log = logging.getLogger("finetune_trainer")

TERMINATION_LOG_ENV = "FINETUNE_TERMINATION_LOG"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m finetune_trainer", description="Run one FineTuneJob's training.")
    parser.add_argument("--config", help="trainer config JSON (the operator mounts it at /etc/finetune/config.json)")
    parser.add_argument(
        "--termination-log",
        help=f"where to write `Reason: message` (default: ${TERMINATION_LOG_ENV}, "
        f"else {TERMINATION_LOG} when it exists)",
    )
    parser.add_argument(
        "--self-check", action="store_true", help="check torch, CUDA arches and bitsandbytes, then exit"
    )
    parser.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="processes to train with, overriding the plan (for CPU runs; GPUs get one process each)",
    )
    parser.add_argument(
        CHECK_INPUTS_FLAG,
        action="store_true",
        help="check the model and dataset (paths, model config, data) on the CPU, then exit: the pre-flight Job",
    )
    parser.add_argument(
        FETCH_INPUTS_FLAG,
        action="store_true",
        help="fetch the S3 sources into the object cache claim (or reuse the copy there), check them, then exit: "
        "the fetch Job",
    )
    parser.add_argument(
        EXPORT_ONLY_FLAG,
        action="store_true",
        help="write the output formats again from the adapter a finished run saved, on the CPU, then exit "
        "(`ftjob export`)",
    )
    parser.add_argument(
        "--formats",
        default="",
        metavar="NAMES",
        help=f"with {EXPORT_ONLY_FLAG}: only these of the job's formats (comma-separated; default: all of them)",
    )
    # Set by the launcher on the processes it starts; not for users.
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def load_config(path: str) -> TrainerConfig:
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TrainerFailure(ExitReason.InvalidConfig, f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TrainerFailure(ExitReason.InvalidConfig, f"{path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise TrainerFailure(ExitReason.InvalidConfig, f"{path}: line {exc.lineno}: invalid JSON: {exc.msg}") from None
    try:
        return TrainerConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(str(p) for p in problems_from(exc, TrainerConfig))
        raise TrainerFailure(ExitReason.InvalidConfig, f"{path}: {problems}") from None


def _termination_path(explicit: str | None) -> Path | None:
    chosen = explicit or os.environ.get(TERMINATION_LOG_ENV)
    if chosen:
        return Path(chosen)
    # The kubelet creates the file in a pod; elsewhere (a laptop) /dev is no place to write.
    default = Path(TERMINATION_LOG)
    return default if default.exists() else None


def _write_termination(path: Path | None, reason: ExitReason, message: str) -> None:
    _write_termination_text(path, termination_message(reason, message))


def _write_termination_text(path: Path | None, text: str) -> None:
    if path is None:
        return
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        log.warning("cannot write the termination log %s: %s", path, exc)


def _say_export(termination: Path | None, config_path: str, since: float) -> None:
    """A run that trained but could not write a format still exits 0, and says which in its
    termination message (`ExportFailed: gguf: <cause>`), from the summary it wrote: the operator's
    Exported condition reads it. Under the launcher too, whose ranks write the summary."""
    from ..outputs.export import export_failures

    failed = export_failures(Path(load_config(config_path).paths.output), since)
    if failed:
        _write_termination_text(termination, export_failed_message(failed))


def _is_out_of_memory(exc: BaseException) -> bool:
    return type(exc).__name__ == "OutOfMemoryError" or "CUDA out of memory" in str(exc)


def configure_logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def log_ending(reason: ExitReason, message: str) -> None:
    """A suspend, a preemption or a drain (Interrupted) is the platform's doing, with a checkpoint
    just written to resume from: said at INFO, so that only real failures read as errors."""
    log.log(logging.INFO if reason is ExitReason.Interrupted else logging.ERROR, "%s: %s", reason.name, message)


def fail(path: Path | None, reason: ExitReason, message: str) -> int:
    from ..reporting.progress import emit

    _write_termination(path, reason, message)
    log_ending(reason, message)
    emit("failed", reason=reason.name, message=message)
    return int(reason)


def _outcome(termination: Path | None, run: Callable[[], object], worker: bool) -> int:
    """Run, and turn every ending into an exit code and a reason (a worker records its own)."""
    try:
        run()
        return 0
    except TrainerFailure as failure:
        reason, message = failure.reason, failure.message
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if _is_out_of_memory(exc):
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            reason, message = (
                ExitReason.OutOfMemory,
                f"{first}; lower spec.training.maxLength or batchSize, or add GPUs",
            )
        else:
            log.exception("trainer error")
            reason, message = ExitReason.TrainerError, f"{type(exc).__name__}: {exc}"
    if worker:
        # The launcher speaks for the pod: it names one rank's reason, once, on stdout and in
        # the termination log. A worker only records its own.
        from .launcher import write_reason

        log_ending(reason, message)
        write_reason(reason, message)
        return int(reason)
    return fail(termination, reason, message)


def _run(args: argparse.Namespace) -> None:
    """The whole run of this process; every ending it cannot name is raised to `_outcome`."""
    config = load_config(args.config)
    from .environment import prepare_process_environment

    prepare_process_environment(config)
    from ..state.stopping import StopRequest
    from ..training.launch_plan import decide_pod, receive
    from ..training.recipe import train

    if args.worker:
        from ..distributed.topology import from_env
        from .launcher import check_placement, die_with_launcher, record_done, register_worker

        stop = StopRequest().install()
        die_with_launcher()
        register_worker()
        check_placement()
        # The launcher decided the launch once for the pod; the worker trains that decision.
        train(config, from_env(), stop, receive())
        record_done()
        return
    _check_nproc(args.nproc)
    from .object_steps import check_hub

    check_hub(config)
    decision = decide_pod(config)
    try:
        _train_pod(args, config, decision)
    except Exception as exc:
        message = _out_of_memory(exc)
        if message is None:
            raise
        from ..memory.oom_retry import settle

        # The pod's command made the launch decision, so it decides the one retry.
        raise settle(config, decision.savers(config), retried=decision.retry is not None, message=message) from None


def _train_pod(args: argparse.Namespace, config: TrainerConfig, decision: "Decision") -> None:
    """Train the decision in this process, or in the processes the launcher starts."""
    from ..state.stopping import StopRequest
    from ..training.recipe import train

    # The plan's process count, unless `--nproc` says otherwise (CPU runs).
    processes = args.nproc or decision.launch.processes
    from .launcher import nodes_from_env

    if processes == 1 and nodes_from_env() is None:
        train(config, stop=StopRequest().install(), decision=decision)
        return
    from .launcher import launch

    reason, message = launch(args.config, processes, decision)
    if reason is not None:
        raise TrainerFailure(reason, message)


def _out_of_memory(exc: Exception) -> str | None:
    """What a rank said of running out of GPU memory (a rank in training says where and its
    peak: steps.Steps._out_of_memory), or None for every other failure."""
    if isinstance(exc, TrainerFailure):
        return exc.message if exc.reason == ExitReason.OutOfMemory else None
    if _is_out_of_memory(exc):
        return f"before training: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    return None


def _check_nproc(nproc: int | None) -> None:
    if nproc is not None and nproc < 1:
        raise TrainerFailure(ExitReason.InvalidConfig, f"--nproc: expected 1 or more, got {nproc}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging()
    faults.install()  # the no-op hooks, unless a test harness names its own (faults.FAULTS_ENV)
    termination = None if args.worker else _termination_path(args.termination_log)
    if args.self_check:
        return _outcome(termination, _self_check, worker=False)
    if not args.config:
        return fail(termination, ExitReason.InvalidConfig, "--config PATH is required")
    if args.check_inputs:
        return _outcome(termination, lambda: _check_inputs(args.config, termination), worker=False)
    if args.fetch_inputs:
        return _outcome(termination, lambda: _fetch_inputs(args.config, termination), worker=False)
    if args.export_only:
        only = [name for name in (part.strip() for part in args.formats.split(",")) if name]
        return _outcome(termination, lambda: _export_only(args.config, only), worker=False)
    started = time.time()
    code = _outcome(termination, lambda: _run(args), worker=args.worker)
    if args.worker:
        _end_worker(code)
    if code == 0:
        code = _outcome(termination, lambda: _upload(args.config), worker=False)
    if code == 0:
        _say_export(termination, args.config, started)
    return code


def _end_worker(code: int) -> NoReturn:
    """End a worker without the interpreter's teardown: a live process group's destructor can
    deadlock against its own worker thread (see recipe.Recipe.run), and the launcher would wait on the
    rank forever. Everything the worker owes is written by now."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(code)


def _check_inputs(path: str, termination: Path | None) -> None:
    """The pre-flight: the claims' inputs checked, the S3 sources listed (their bytes said in the
    termination message, for the operator to size the object cache claim)."""
    config = load_config(path)
    from .environment import prepare_process_environment

    prepare_process_environment(config)
    from ..reporting.progress import emit
    from .input_check import check_inputs
    from .object_steps import list_inputs, listed_message

    checked = check_inputs(config)
    listed = list_inputs(config)
    if listed is not None:
        checked["objects"] = listed
        _write_termination_text(termination, listed_message(listed))
    emit("inputsChecked", **checked)


def _fetch_inputs(path: str, termination: Path | None) -> None:
    """The fetch Job: the S3 sources onto the object cache claim, then every input checked there."""
    config = load_config(path)
    from .environment import prepare_process_environment

    prepare_process_environment(config)
    from ..reporting.progress import emit
    from .input_check import check_inputs
    from .object_steps import fetch_inputs, fetched_message

    done = fetch_inputs(config)
    checked = check_inputs(config, fetched=True)
    _write_termination_text(termination, fetched_message(done))
    emit("inputsFetched", sources=done, **checked)


def _upload(path: str) -> None:
    """After training ended well: the outputs to output.s3, if the job names it."""
    from .object_steps import upload

    copied = upload(load_config(path))
    if copied is not None:
        from ..reporting.progress import emit

        emit("outputsCopied", **copied)


def _export_only(path: str, only: list[str]) -> None:
    config = load_config(path)
    from .environment import prepare_process_environment

    prepare_process_environment(config)
    from ..outputs.export_only import export_again
    from ..reporting.progress import emit

    emit("exported", formats=export_again(config, only))


def _self_check() -> None:
    from ..hardware.self_check import check_gpu_stack

    print(json.dumps({"event": "selfCheck", "ok": True, **check_gpu_stack()}), flush=True)

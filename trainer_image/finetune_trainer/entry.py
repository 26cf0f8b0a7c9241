"""Command line of the trainer: read the config, run, and always leave a reason behind.

Every ending maps to an exit code and a `Reason: message` line in the termination log (the
operator's podFailurePolicy and status logic read both). A user's mistake is one line; only
a bug in the trainer itself prints a traceback, to the log, for whoever fixes it.
"""

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from finetune_api.problems import problems_from
from finetune_api.reasons import TERMINATION_LOG, ExitReason, termination_message
from finetune_api.trainer_config import TrainerConfig

from .failures import TrainerFailure

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
    if path is None:
        return
    try:
        path.write_text(termination_message(reason, message), encoding="utf-8")
    except OSError as exc:
        log.warning("cannot write the termination log %s: %s", path, exc)


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


def fail(path: Path | None, reason: ExitReason, message: str) -> int:
    from .progress import emit

    _write_termination(path, reason, message)
    log.error("%s: %s", reason.name, message)
    emit("failed", reason=reason.name, message=message)
    return int(reason)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging()
    termination = _termination_path(args.termination_log)
    try:
        if args.self_check:
            from .self_check import check_gpu_stack

            print(json.dumps({"event": "selfCheck", "ok": True, **check_gpu_stack()}), flush=True)
            return 0
        if not args.config:
            raise TrainerFailure(ExitReason.InvalidConfig, "--config PATH is required")
        config = load_config(args.config)
        from .environment import prepare_process_environment

        prepare_process_environment(config)
        from .run import train

        train(config)
        return 0
    except TrainerFailure as failure:
        return fail(termination, failure.reason, failure.message)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if _is_out_of_memory(exc):
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return fail(
                termination,
                ExitReason.OutOfMemory,
                f"{first}; lower spec.training.maxLength or batchSize, or add GPUs",
            )
        log.exception("trainer error")
        return fail(termination, ExitReason.TrainerError, f"{type(exc).__name__}: {exc}")

"""Entry point of `ftjob` / `kubectl finetune`: one sub-command per module."""

import argparse
import importlib
import sys
from collections.abc import Sequence

from .errors import CliError

# Each module exposes `add_parser(subparsers)`; the parser's `handler` returns the exit code.
COMMAND_MODULES = (
    "finetune_cli.validate",
    "finetune_cli.run_local",
    "finetune_cli.check_data",
    "finetune_cli.make_tiny_model",
    "finetune_cli.plan",
    "finetune_cli.submit",
    "finetune_cli.jobs",
    "finetune_cli.watch",
    "finetune_cli.logs",
    "finetune_cli.report",
    "finetune_cli.compare",
    "finetune_cli.upload",
    "finetune_cli.export",
    "finetune_cli.serve",
    "finetune_cli.chat",
    "finetune_cli.lm_eval_run",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ftjob", description="Validate, plan, run and follow FineTuneJobs (finetune.dev/v1alpha1)."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # the last line of defence: users never see a traceback
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())

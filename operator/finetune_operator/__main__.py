"""`python -m finetune_operator`: the operator with its flags; env vars give the defaults."""

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence
from typing import Any

import kopf

from . import (
    handlers,  # noqa: F401 (registers the kopf handlers)
    log_levels,
)
from .memory import limit_malloc_arenas
from .setting_parsers import SettingsError, boolean
from .settings import SETTINGS, Settings, check, from_env


def build_parser() -> argparse.ArgumentParser:
    """A flag for each setting of the table that has one (settings.SETTINGS); each takes the
    text its variable would, read by the same parser once the flags are in."""
    parser = argparse.ArgumentParser(
        prog="python -m finetune_operator",
        description="Run the FineTuneJob operator. Every flag has an environment variable.",
    )
    # -A is the namespaces setting left empty: cluster-wide.
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-A", "--all-namespaces", dest="namespaces", action="store_const", const="", help="watch every namespace"
    )
    for row in SETTINGS.values():
        if not row.flag:
            continue
        where = scope if row.name == "namespaces" else parser
        variables = f"{row.env}, else {row.fallback}" if row.fallback else row.env
        options: dict[str, Any] = {"dest": row.name, "help": f"{row.doc} ({variables})"}
        if row.parse is boolean:
            options.update(action=argparse.BooleanOptionalAction, default=None)
        else:
            options["metavar"] = row.flag[-1].lstrip("-").replace("-", "_").upper()
        if row.repeated:
            options["action"] = "append"
        where.add_argument(*row.flag, **options)
    return parser


def settings_from(args: argparse.Namespace, base: Settings) -> Settings:
    """`base` (the environment's) with the flags given on top; a bad one names the flag."""
    updates: dict[str, Any] = {}
    for row in SETTINGS.values():
        value = getattr(args, row.name, None) if row.flag else None
        if value is None:
            continue
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, list):
            value = ",".join(value)
        if value or row.blank:
            updates[row.name] = row.parse(row.flag[-1], value)
    return dataclasses.replace(base, **updates)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = check(settings_from(args, from_env()))
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    kopf.configure(
        verbose=settings.log_level == "DEBUG",
        log_format=kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.FULL,
    )
    logging.getLogger().setLevel(settings.log_level)
    log_levels.install()
    # The API client logs whole request and response bodies at DEBUG: too much, and never needed.
    for noisy in ("kubernetes", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.INFO, logging.getLogger().level))
    # kopf says "Handler ... succeeded" for every watch event and aiohttp logs every probe: at
    # 500 jobs that is most of the log and a fair share of the CPU. Failures stay visible.
    if settings.log_level != "DEBUG":
        for chatty in ("kopf.objects", "aiohttp.access"):
            logging.getLogger(chatty).setLevel(logging.WARNING)
    limit_malloc_arenas()
    liveness = f"http://{settings.listen_address}:{settings.health_port}/healthz" if settings.health_port else None
    kopf.run(
        clusterwide=settings.clusterwide,
        namespaces=settings.namespaces,
        liveness_endpoint=liveness,
        standalone=True,
        memo=kopf.Memo(settings=settings),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

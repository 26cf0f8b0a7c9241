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
from .settings import LOG_FORMATS, LOG_LEVELS, Settings, SettingsError, check, from_env


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m finetune_operator",
        description="Run the FineTuneJob operator. Every flag has a FINETUNE_* environment variable.",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="watch this namespace (repeatable); default: FINETUNE_NAMESPACES, else cluster-wide",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    parser.add_argument("--trainer-image", help="trainer image for jobs that name none")
    parser.add_argument("--metrics-port", type=int, help="Prometheus metrics port (0 = off)")
    parser.add_argument("--health-port", type=int, help="liveness port, serves /healthz (0 = off)")
    parser.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run as one of several replicas: reconcile only while holding the Lease (FINETUNE_LEADER_ELECTION)",
    )
    parser.add_argument("--lease-name", help="the Lease's name (FINETUNE_LEASE_NAME)")
    parser.add_argument(
        "--lease-namespace", help="the Lease's namespace (FINETUNE_LEASE_NAMESPACE, else POD_NAMESPACE)"
    )
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS)
    parser.add_argument("--log-format", choices=LOG_FORMATS)
    return parser


def settings_from(args: argparse.Namespace, base: Settings) -> Settings:
    updates: dict[str, Any] = {}
    if args.all_namespaces:
        updates["namespaces"] = ()
    elif args.namespaces:
        updates["namespaces"] = tuple(args.namespaces)
    if args.leader_elect is not None:
        updates["leader_election"] = args.leader_elect
    for flag in (
        "trainer_image",
        "metrics_port",
        "health_port",
        "log_level",
        "log_format",
        "lease_name",
        "lease_namespace",
    ):
        value = getattr(args, flag)
        if value is not None:
            updates[flag] = value
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

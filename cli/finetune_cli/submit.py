"""`ftjob submit FILE`: validate offline with the API models, then create on the cluster."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from finetune_api import ManifestError, parse_file
from finetune_api.problems import format_problems

from . import kube
from .errors import CliError


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "submit",
        help="validate FineTuneJob YAML, then create it",
        description="Validate every FineTuneJob in FILE offline, then create them; nothing is created "
        "when any document is invalid.",
    )
    parser.add_argument("file", metavar="FILE")
    parser.add_argument("--dry-run", action="store_true", help="let the API server validate, create nothing")
    kube.add_options(parser)
    parser.set_defaults(handler=run)


def _bodies(path: str) -> list[dict[str, Any]]:
    try:
        documents = parse_file(path)
    except ManifestError as exc:
        raise CliError(f"{path}: {exc}") from None
    problems: list[str] = []
    for doc in documents:
        source = path if len(documents) == 1 else f"{path}[{doc.index}]"
        problems.extend(format_problems(doc.problems, source))
    if problems:
        # Every problem is worth seeing; the CliError line says nothing was created.
        for line in problems[:-1]:
            print(f"error: {line}", file=sys.stderr)
        raise CliError(f"{problems[-1]} (nothing submitted)")
    return [as_stored(doc.body) for doc in documents if doc.body is not None]


def as_stored(body: dict[str, Any]) -> dict[str, Any]:
    """The body in the CRD's shape: `lora.targetModules: all-linear` (PEFT's spelling, which the
    API models accept) becomes the one-item list the CRD stores."""
    lora = (body.get("spec") or {}).get("lora")
    if isinstance(lora, dict) and isinstance(lora.get("targetModules"), str):
        lora["targetModules"] = [lora["targetModules"]]
    return body


def run(args: argparse.Namespace) -> int:
    bodies = _bodies(args.file)
    cluster = kube.connect(args)
    api = cluster.custom()
    for body in bodies:
        meta = body.setdefault("metadata", {})
        namespace = meta.get("namespace")
        if args.namespace and namespace and namespace != args.namespace:
            raise CliError(f"{args.file}: metadata.namespace is {namespace} but --namespace is {args.namespace}")
        target = kube.Cluster(cluster.api, namespace or cluster.namespace)
        name = meta.get("name") or f"{meta.get('generateName', '')}*"
        extra = {"dry_run": "All"} if args.dry_run else {}
        with kube.api_errors(target, f"finetunejob {name}"):
            created = api.create_namespaced_custom_object(*kube.job_api_args(target), body, **extra)
        verb = "created (server dry run)" if args.dry_run else "created"
        print(f"finetunejob.finetune.dev/{created['metadata']['name']} {verb} in namespace {target.namespace}")
    return 0

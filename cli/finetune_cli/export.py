"""`ftjob export NAME`: write a finished job's output formats again from its saved adapter.

For a job whose export failed after training (its Exported condition False, reason ExportFailed),
once the cause is mended (e.g. llama.cpp's converter now takes the model), or to write the
formats again. The CLI runs the trainer's `--export-only` in a Job of its own on the CPU, built
from the job's trainer Job (export_job.py), waits for it and says what it wrote, or why not in
one line. The job's status keeps what its training pod said; the output folder's summary.json is
brought up to date.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from finetune_api.formats import ALWAYS, written
from finetune_api.reasons import parse_termination_message

from . import kube
from .errors import CliError
from .export_job import LABEL_EXPORT_OF, export_job, export_job_name

POLL_SECONDS = 2.0


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "export",
        help="write a finished job's output formats again from its adapter",
        description="Write the output formats of the finished FineTuneJob NAME (spec.output.formats) again from "
        "the adapter it saved, e.g. after its export failed (condition Exported=False) and the cause was mended. "
        "Runs the trainer's --export-only in a Job NAME-export on the CPU, made from the job's trainer Job (the "
        "same image, config and claims, no GPU), waits for it and prints what it wrote, or why not.",
    )
    parser.add_argument("name", metavar="NAME")
    parser.add_argument(
        "--format",
        dest="formats",
        action="append",
        default=[],
        metavar="FORMAT",
        help="only this format of the job's (repeatable; default: all of them beyond peft)",
    )
    parser.add_argument("--no-wait", action="store_true", help="create the export Job and return")
    parser.add_argument(
        "--timeout", type=float, default=3600.0, metavar="SECONDS", help="how long to wait for it (default 3600)"
    )
    kube.add_options(parser)
    parser.set_defaults(handler=run)


def _formats(job: dict[str, Any], asked: list[str]) -> list[str]:
    output = (job.get("spec") or {}).get("output") or {}
    theirs = written([*(output.get("formats") or []), *(("merged",) if output.get("merge") else ())])
    unknown = [name for name in asked if name not in theirs]
    if unknown:
        raise CliError(f"--format {', '.join(unknown)}: not among the job's formats ({', '.join(theirs)})")
    if not asked and theirs == (ALWAYS,):
        raise CliError(f"finetunejob {job['metadata']['name']} writes peft alone: there is nothing to export")
    return [name for name in theirs if name in asked or (not asked and name != ALWAYS)]


def _trainer_job(cluster: kube.Cluster, name: str) -> dict[str, Any]:
    from kubernetes import client

    batch = client.BatchV1Api(cluster.api)
    with kube.api_errors(cluster, f"the trainer Job of finetunejob {name} (gone after ttlSecondsAfterFinished?)"):
        found: dict[str, Any] = cluster.api.sanitize_for_serialization(
            batch.read_namespaced_job(name, cluster.namespace)
        )
    return found


def _replace(cluster: kube.Cluster, body: dict[str, Any]) -> None:
    """Create the export Job, deleting a finished one of the same name first (one at a time)."""
    from kubernetes import client

    batch: Any = client.BatchV1Api(cluster.api)
    name = body["metadata"]["name"]
    with kube.api_errors(cluster, f"job {name}"):
        old = batch.list_namespaced_job(cluster.namespace, field_selector=f"metadata.name={name}").items
        if old and not any(c.status == "True" for c in old[0].status.conditions or []):
            raise CliError(f"job {name} is still running: wait for it, or delete it")
        if old:
            batch.delete_namespaced_job(name, cluster.namespace, propagation_policy="Foreground")
            while batch.list_namespaced_job(cluster.namespace, field_selector=f"metadata.name={name}").items:
                time.sleep(POLL_SECONDS)
        batch.create_namespaced_job(cluster.namespace, body)


def _ending(cluster: kube.Cluster, job: str) -> tuple[bool, str]:
    """Whether the export pod succeeded, and what it said (its termination message)."""
    pods = cluster.core().list_namespaced_pod(cluster.namespace, label_selector=f"{LABEL_EXPORT_OF}={job}").items
    for pod in sorted(pods, key=lambda p: p.metadata.creation_timestamp, reverse=True):
        for status in pod.status.container_statuses or []:
            ended = status.state.terminated if status.state else None
            if ended is not None:
                reason, message = parse_termination_message(ended.message)
                said = f"{reason}: {message}" if reason else message
                return ended.exit_code == 0, said or f"exit code {ended.exit_code}"
    return False, ""


def _wait(cluster: kube.Cluster, job: str, name: str, timeout: float) -> tuple[bool, str]:
    from kubernetes import client

    batch: Any = client.BatchV1Api(cluster.api)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with kube.api_errors(cluster, f"job {name}"):
            conditions = batch.read_namespaced_job(name, cluster.namespace).status.conditions or []
            if any(c.type in ("Complete", "Failed") and c.status == "True" for c in conditions):
                return _ending(cluster, job)
        time.sleep(POLL_SECONDS)
    raise CliError(f"job {name} did not finish within {timeout:g} s (it goes on; ftjob export {job} again to see)")


def run(args: argparse.Namespace) -> int:
    cluster = kube.connect(args)
    job = kube.get_job(cluster, args.name)
    phase = (job.get("status") or {}).get("phase")
    if phase != "Succeeded":
        raise CliError(f"finetunejob {args.name} is {phase or 'not started'}: export writes a finished job's formats")
    formats = _formats(job, args.formats)
    body = export_job(job, _trainer_job(cluster, args.name), formats)
    name = body["metadata"]["name"]
    _replace(cluster, body)
    if args.no_wait:
        print(f"job/{name} created")
        return 0
    ok, said = _wait(cluster, args.name, export_job_name(args.name), args.timeout)
    if not ok:
        raise CliError(f"export of {args.name} failed: {said}")
    print(f"{args.name}: exported {', '.join(formats)} (job/{name}; summary.json updated)")
    return 0

"""`ftjob list | status | suspend | resume | delete`: the FineTuneJob lifecycle from a terminal."""

from __future__ import annotations

import argparse
import json
from typing import Any

import yaml

from finetune_api.constants import GROUP, PLURAL, VERSION

from . import kube
from .display import age, condition, failure_text, one_line, progress_parts, queue_text


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    listing = commands.add_parser(
        "list", help="list FineTuneJobs", description="List FineTuneJobs with phase and progress."
    )
    listing.add_argument("-A", "--all-namespaces", action="store_true", help="list jobs of every namespace")
    kube.add_options(listing)
    listing.set_defaults(handler=run_list)

    status = commands.add_parser(
        "status",
        help="show one job or model server",
        description="Phase, conditions, progress, last checkpoint and output of a job; of a ModelServer (NAME, or "
        "modelserver/NAME where a job has the same name), its phase, endpoint and adapters with their ids.",
    )
    status.add_argument("name", metavar="NAME")
    status.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    kube.add_options(status)
    status.set_defaults(handler=run_status)

    for verb, value, text in (
        ("suspend", True, "suspend a job (its pod stops; resume continues from the last checkpoint)"),
        ("resume", False, "resume a suspended job"),
    ):
        parser = commands.add_parser(verb, help=text, description=text[0].upper() + text[1:] + ".")
        parser.add_argument("name", metavar="NAME")
        kube.add_options(parser)
        parser.set_defaults(handler=run_suspend, suspend=value)

    delete = commands.add_parser(
        "delete", help="delete a job", description="Delete a FineTuneJob; its Job and pods go with it."
    )
    delete.add_argument("name", metavar="NAME")
    kube.add_options(delete)
    delete.set_defaults(handler=run_delete)


def _row(job: dict[str, Any], with_namespace: bool) -> list[str]:
    meta, spec, status = job.get("metadata") or {}, job.get("spec") or {}, job.get("status") or {}
    progress = status.get("progress") or {}
    step, total = progress.get("step"), progress.get("totalSteps")
    loss = progress.get("loss")
    # Why a job failed, in one word; `ftjob status NAME` says the rest.
    failed = status.get("phase") == "Failed"
    reason = str((condition(status, "Failed") or {}).get("reason") or "Failed") if failed else ""
    row = [
        str(meta.get("name", "")),
        str(status.get("phase") or "-"),
        f"{step}/{total}"
        if isinstance(step, int) and isinstance(total, int)
        else str(step if step is not None else "-"),
        f"{loss:.4g}" if isinstance(loss, (int, float)) else "-",
        str((spec.get("resources") or {}).get("gpus", "-")),
        age(meta.get("creationTimestamp")),
        reason,
    ]
    return [str(meta.get("namespace", "")), *row] if with_namespace else row


def run_list(args: argparse.Namespace) -> int:
    cluster = kube.connect(args)
    api = cluster.custom()
    with kube.api_errors(cluster, "finetunejobs"):
        if args.all_namespaces:
            result = api.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        else:
            result = api.list_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL)
    items = sorted(result.get("items") or [], key=lambda j: (j["metadata"].get("namespace", ""), j["metadata"]["name"]))
    if not items:
        where = "any namespace" if args.all_namespaces else f"namespace {cluster.namespace}"
        print(f"No finetunejobs in {where}.")
        return 0
    header = ["NAME", "PHASE", "STEP", "LOSS", "GPUS", "AGE", "REASON"]
    if args.all_namespaces:
        header = ["NAMESPACE", *header]
    rows = [header, *(_row(job, args.all_namespaces) for job in items)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    return 0


def describe(job: dict[str, Any]) -> str:
    meta, status = job.get("metadata") or {}, job.get("status") or {}
    spec = job.get("spec") or {}
    lines = [
        f"Name:        {meta.get('name')}",
        f"Namespace:   {meta.get('namespace')}",
        f"Phase:       {status.get('phase') or 'Pending (not yet seen by the operator)'}"
        + ("  (suspend requested)" if spec.get("suspend") and status.get("phase") != "Suspended" else ""),
    ]
    if status.get("phase") == "Failed":
        lines.append(f"Reason:      {failure_text(status)}")
    elif status.get("message"):
        lines.append(f"Message:     {one_line(status['message'])}")
    retried = status.get("oomRetry") or {}
    if retried.get("message"):
        lines.append(f"OOM retry:   {one_line(retried['message'])}")
    queue = status.get("queue") or {}
    if queue:
        lines.append(f"Queue:       {queue_text(queue)}")
    parts = progress_parts(status.get("progress"))
    lines.append(f"Progress:    {', '.join(parts) if parts else '-'}")
    checkpoint = status.get("lastCheckpoint") or {}
    if checkpoint:
        lines.append(
            f"Checkpoint:  step {checkpoint.get('step', '?')} at {checkpoint.get('path', '?')}"
            + (f" ({age(checkpoint.get('time'))} ago)" if checkpoint.get("time") else "")
        )
    else:
        # Only what this job reported: a re-created job's start may find older ones (its message says).
        lines.append("Checkpoint:  none reported by this job")
    lines.extend(output_lines(status.get("output") or {}, status.get("sample") or {}))
    evaluation = status.get("evaluation") or {}
    if evaluation.get("summary"):
        # The one line; `ftjob report` and `ftjob compare` give the whole table.
        lines.append(f"Evaluation:  {evaluation['summary']} (tuned at step {evaluation.get('step', '?')})")
    lines.append(f"Restarts:    {status.get('restarts') or 0}")
    if status.get("startTime"):
        lines.append(f"Started:     {status['startTime']} ({age(status['startTime'])} ago)")
    if status.get("completionTime"):
        lines.append(f"Completed:   {status['completionTime']}")
    conditions = status.get("conditions") or []
    if conditions:
        lines.append("Conditions:")
        rows = [["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]]
        for c in conditions:
            rows.append(
                [
                    str(c.get("type", "")),
                    str(c.get("status", "")),
                    str(c.get("reason") or "-"),
                    age(c.get("lastTransitionTime")),
                    " ".join(str(c.get("message") or "").split()),
                ]
            )
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        for r in rows:
            lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
    return "\n".join(line.rstrip() for line in lines)


def output_lines(output: dict[str, Any], sample: dict[str, Any]) -> list[str]:
    """What the job writes and how to serve it (status.output), and its first sample answer."""
    lines = []
    if output:
        pieces = [
            f"claim {output['claimName']}" if output.get("claimName") else "",
            f"adapter {output['adapterPath']}" if output.get("adapterPath") else "",
            f"merged {output['mergedPath']}" if output.get("mergedPath") else "",
        ]
        lines.append(f"Output:      {', '.join(p for p in pieces if p)}")
    if output.get("baseModel"):
        targets = ",".join(output.get("targetModules") or [])
        lines.append(
            f"Adapter:     base {output['baseModel']}, rank {output.get('rank')}, alpha {output.get('alpha')}"
            + (f", modules {targets}" if targets else "")
        )
    for entry in output.get("formats") or []:
        lines.append(f"Serve {entry.get('format', '?')}: ".ljust(13) + str(entry.get("serve") or entry.get("path")))
    claim = f" (claim {output['claimName']})" if output.get("claimName") else ""
    if output.get("lossCurvePath"):
        lines.append(f"Loss curve:  {output['lossCurvePath']}{claim}, written when training ends")
    if output.get("tensorboardPath"):
        lines.append(f"TensorBoard: {output['tensorboardPath']}{claim}; see docs/using.md#tensorboard")
    if output.get("warning"):
        lines.append(f"Warning:     {one_line(output['warning'])}")
    if sample.get("answer") is not None:
        lines.append(f"Sample:      {one_line(str(sample.get('prompt') or ''))!r} -> {one_line(sample['answer'])!r}")
    return lines


SERVER_PREFIXES = ("modelserver/", "modelservers/", "ms/")


def _job_or_server(cluster: kube.Cluster, name: str) -> tuple[dict[str, Any], bool]:
    """(the object, whether it is a ModelServer): a job of that name first, else a server."""
    from .errors import CliError
    from .servers import get_server

    for prefix in SERVER_PREFIXES:
        if name.startswith(prefix):
            return get_server(cluster, name.removeprefix(prefix)), True
    try:
        return kube.get_job(cluster, name), False
    except CliError as missing:
        try:
            return get_server(cluster, name), True
        except CliError:
            raise missing from None


def run_status(args: argparse.Namespace) -> int:
    from .servers import describe as describe_server

    cluster = kube.connect(args)
    job, is_server = _job_or_server(cluster, args.name)
    if is_server and args.output == "text":
        print(describe_server(job))
        return 0
    if args.output == "json":
        print(json.dumps(job, indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump(job, sort_keys=False), end="")
    else:
        print(describe(job))
    return 0


def run_suspend(args: argparse.Namespace) -> int:
    cluster = kube.connect(args)
    with kube.api_errors(cluster, f"finetunejob {args.name}"):
        cluster.custom().patch_namespaced_custom_object(
            *kube.job_api_args(cluster), args.name, {"spec": {"suspend": args.suspend}}
        )
    print(f"finetunejob.finetune.dev/{args.name} {'suspended' if args.suspend else 'resumed'}")
    return 0


def run_delete(args: argparse.Namespace) -> int:
    cluster = kube.connect(args)
    with kube.api_errors(cluster, f"finetunejob {args.name}"):
        cluster.custom().delete_namespaced_custom_object(
            *kube.job_api_args(cluster), args.name, body={"propagationPolicy": "Background"}
        )
    print(f"finetunejob.finetune.dev/{args.name} deleted")
    return 0

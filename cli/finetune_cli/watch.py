"""`ftjob watch NAME`: a live progress line until the job finishes.

Exit 0 when it succeeds; 1 with `Reason: message` when it fails; 3 when no node of its product can
ever hold its pods (the operator's Schedulable=False, the same verdict `ftjob plan` exits 3 on);
124 on --timeout. While no trainer runs, the line says why the job waits, in the status's words
(the scheduler's, Kueue's, a quota's, the input check's). Uses the API server's watch (re-listing
when the watch expires), so it sees every status change without polling; on a terminal the line
updates in place, elsewhere each change is a new line.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

from . import kube
from .display import bar, condition, failure_text, one_line, progress_parts
from .errors import CliError

WATCH_WINDOW_SECONDS = 30
# No node of the job's product can ever hold its pods: the exit `ftjob plan` gives such a job.
CANNOT_RUN_HERE = 3


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "watch",
        help="follow a job's progress until it finishes",
        description="Show step/total, loss, tokens/s and ETA live, and while no trainer runs why the job waits; "
        "exit 0 when the job succeeds, 1 with the reason when it fails, 3 when no node of its product can ever "
        "hold its pods (the status's Schedulable condition), 124 on --timeout.",
    )
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("--timeout", type=float, metavar="SECONDS", help="give up after this long (exit 124)")
    kube.add_options(parser)
    parser.set_defaults(handler=run)


def status_line(job: dict[str, Any]) -> str:
    """Phase, bar and progress; with no progress yet, why the job waits (the status message)."""
    status = job.get("status") or {}
    phase = status.get("phase") or "Pending"
    progress = status.get("progress")
    parts = progress_parts(progress)
    text = f"{phase:<9} {bar(progress)}"
    if parts:
        return f"{text} {', '.join(parts)}"
    waiting = one_line(status.get("message"))
    return f"{text} {waiting}" if waiting and phase not in ("Succeeded", "Failed") else text


class Printer:
    """Rewrites one line on a terminal; prints changed lines elsewhere (logs, CI)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.live = out.isatty()
        self.last = ""

    def show(self, line: str) -> None:
        if line == self.last:
            return
        if self.live:
            self.out.write("\r\033[K" + line)
        else:
            self.out.write(line + "\n")
        self.out.flush()
        self.last = line

    def finish(self) -> None:
        if self.live and self.last:
            self.out.write("\n")
            self.out.flush()


def _outcome(job: dict[str, Any], printer: Printer) -> int | None:
    printer.show(status_line(job))
    status = job.get("status") or {}
    phase = status.get("phase")
    if phase == "Succeeded":
        printer.finish()
        output = (status.get("output") or {}).get("adapterPath")
        print(f"finetunejob {job['metadata']['name']} succeeded" + (f": adapter at {output}" if output else ""))
        return 0
    if phase == "Failed":
        printer.finish()
        raise CliError(f"finetunejob {job['metadata']['name']} failed: {failure_text(status)}")
    unplaceable = condition(status, "Schedulable")
    if unplaceable and unplaceable.get("status") == "False":
        printer.finish()
        said = f"{unplaceable.get('reason')}: {one_line(unplaceable.get('message'))}"
        raise CliError(f"finetunejob {job['metadata']['name']} cannot run here: {said}", exit_code=CANNOT_RUN_HERE)
    return None


def run(args: argparse.Namespace) -> int:
    from kubernetes import watch as watch_module

    watch: Any = watch_module  # untyped in the client

    cluster = kube.connect(args)
    api = cluster.custom()
    printer = Printer(sys.stdout)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    while True:
        job = kube.get_job(cluster, args.name)
        outcome = _outcome(job, printer)
        if outcome is not None:
            return outcome
        remaining = WATCH_WINDOW_SECONDS if deadline is None else deadline - time.monotonic()
        if remaining <= 0:
            printer.finish()
            status = job.get("status") or {}
            why = one_line(status.get("message"))
            raise CliError(
                f"finetunejob {args.name} still {status.get('phase') or 'Pending'} after {args.timeout:g}s"
                + (f": {why}" if why else ""),
                exit_code=124,
            )
        stream = watch.Watch()
        try:
            with kube.api_errors(cluster, f"finetunejob {args.name}"):
                for event in stream.stream(
                    api.list_namespaced_custom_object,
                    *kube.job_api_args(cluster),
                    field_selector=f"metadata.name={args.name}",
                    resource_version=job["metadata"]["resourceVersion"],
                    timeout_seconds=max(1, int(min(remaining, WATCH_WINDOW_SECONDS))),
                ):
                    if event["type"] == "DELETED":
                        printer.finish()
                        raise CliError(f"finetunejob {args.name} was deleted")
                    if event["type"] in ("ADDED", "MODIFIED"):
                        outcome = _outcome(event["raw_object"], printer)
                        if outcome is not None:
                            return outcome
        except CliError as exc:
            # An expired watch (410 Gone) is routine: list again and carry on.
            if "Expired" not in str(exc) and "too old" not in str(exc):
                raise
        finally:
            stream.stop()

"""`ftjob report NAME [-o FILE] [--open]`: the job's report.html, read from its output claim.

The trainer writes report.html (curves, the base-against-tuned table, the answers) beside the
adapter when training ends; this command reads it through the API server (job_output.py) and
writes it to a local file, which a browser opens as it is: the page holds its pictures itself.
"""

from __future__ import annotations

import argparse
import webbrowser
from pathlib import Path

from finetune_api.layout import REPORT_FILE

from . import kube
from .errors import CliError
from .job_output import add_reader_options, claim_reader, output_place


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "report",
        help="fetch a job's report.html (curves, base against tuned, answers)",
        description="Read the report.html the job NAME wrote into its output folder when training ended (loss "
        "curves, the base-against-tuned table, the answers beside the reference) from its claim, through the API "
        "server and a short-lived pod that mounts the claim, and write it to FILE.",
    )
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("-o", "--output", metavar="FILE", help="where to write it (default: NAME-report.html)")
    parser.add_argument("--open", action="store_true", help="open it in the web browser afterwards")
    add_reader_options(parser)
    kube.add_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    target = Path(args.output or f"{args.name}-report.html")
    if target.is_dir():
        raise CliError(f"-o {target}: a folder; name a file")
    if not target.parent.is_dir():
        raise CliError(f"-o {target}: no folder {target.parent}")
    cluster = kube.connect(args)
    job = kube.get_job(cluster, args.name)
    place = output_place(job)
    with claim_reader(cluster, place.claim, args) as reader:
        page = reader.read(place.file(REPORT_FILE))
    if page is None:
        phase = (job.get("status") or {}).get("phase") or "Pending"
        raise CliError(
            f"finetunejob {args.name} ({phase}) has not written {REPORT_FILE} yet (claim {place.claim}, path "
            f"{place.file(REPORT_FILE)!r}): the trainer writes it when training ends"
        )
    target.write_bytes(page)
    print(f"{target}: report of finetunejob {args.name}, {len(page):,} bytes (claim {place.claim})")
    if args.open and not webbrowser.open(target.resolve().as_uri()):
        print(f"no web browser found here ($BROWSER to name one): open {target} yourself")
    return 0

"""`ftjob compare JOB JOB...`: what differs between jobs, and what each one's evaluation measured.

One table, a column per job: first the settings that differ (each spec flattened to dotted paths,
`training.learningRate`; only the rows where the jobs differ), then each evaluation figure as
`base -> tuned`. The figures come from status.evaluation (short, always there once measured) and,
where the job's output claim can be read, from its evaluation.json (the whole table, with each
figure's direction); the `source` row says which. `compare_table` is a pure builder.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from finetune_api.dotted import dotted_paths
from finetune_api.layout import EVALUATION_FILE

from . import kube
from .errors import CliError
from .job_output import add_reader_options, claim_reader, output_place

MISSING = "-"


@dataclass(frozen=True)
class Figure:
    name: str
    base: float | None
    tuned: float | None
    better: str | None = None  # 'lower' or 'higher'; unknown from the status alone


@dataclass(frozen=True)
class JobView:
    name: str
    spec: Mapping[str, Any]
    figures: Sequence[Figure] = ()
    source: str = "none"  # 'evaluation.json', 'status' or 'none' (and why, where the claim was not read)
    step: int | None = None


@dataclass(frozen=True)
class Table:
    header: list[str]
    settings: list[list[str]] = field(default_factory=list)
    figures: list[list[str]] = field(default_factory=list)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: Any) -> str:
    if value is None:
        return MISSING
    if isinstance(value, (Mapping, list)):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).lower() if isinstance(value, bool) else str(value)


def figure_cell(figure: Figure | None) -> str:
    """`2.31 -> 1.05` (and which side is better, where the direction is known)."""
    if figure is None:
        return MISSING
    cell = f"{_text(figure.base)} -> {_text(figure.tuned)}"
    if figure.better and figure.base is not None and figure.tuned is not None and figure.base != figure.tuned:
        tuned_wins = figure.tuned < figure.base if figure.better == "lower" else figure.tuned > figure.base
        cell += " (better)" if tuned_wins else " (worse)"
    return cell


def compare_table(jobs: Sequence[JobView]) -> Table:
    flat = [dotted_paths(job.spec) for job in jobs]
    paths = sorted({path for spec in flat for path in spec})
    differing = [p for p in paths if len({_text(spec.get(p)) for spec in flat}) > 1]
    table = Table(["", *(job.name for job in jobs)])
    table.settings.extend([path, *(_text(spec.get(path)) for spec in flat)] for path in differing)
    names: list[str] = []
    for job in jobs:
        names += [f.name for f in job.figures if f.name not in names]
    by_name = [{f.name: f for f in job.figures} for job in jobs]
    table.figures.append(["evaluation", *(job.source for job in jobs)])
    table.figures.append(["evaluated at step", *(_text(job.step) for job in jobs)])
    table.figures.extend([name, *(figure_cell(figures.get(name)) for figures in by_name)] for name in names)
    return table


def render_text(table: Table) -> str:
    titles = ["SETTING", *table.header[1:]]
    rows = [titles, *table.settings, *table.figures, ["FIGURE (base -> tuned)"] + [""] * (len(titles) - 1)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(titles))]

    def line(row: Sequence[str]) -> str:
        return "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()

    out = [line(titles), *(line(row) for row in table.settings)]
    if not table.settings:
        out.append("(no setting differs)")
    out += ["", line(["FIGURE (base -> tuned)", *table.header[1:]]), *(line(row) for row in table.figures)]
    return "\n".join(out)


def render_json(jobs: Sequence[JobView]) -> str:
    """The same comparison for a program: the differing settings' values, each job's figures."""
    flat = [dotted_paths(job.spec) for job in jobs]
    table = compare_table(jobs)
    views = [
        {
            "name": job.name,
            "source": job.source,
            "step": job.step,
            "figures": {f.name: {"base": f.base, "tuned": f.tuned, "better": f.better} for f in job.figures},
        }
        for job in jobs
    ]
    settings = {row[0]: [spec.get(row[0]) for spec in flat] for row in table.settings}
    return json.dumps({"settings": settings, "jobs": views}, indent=2)


# --- the command -----------------------------------------------------------------------------------
def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "compare",
        help="the settings that differ between jobs and their evaluation figures, side by side",
        description="One table of the jobs JOB...: the settings that differ between their specs (as dotted paths), "
        "then each evaluation figure as base -> tuned. Figures come from each job's evaluation.json, read from its "
        "output claim through the API server (a short-lived pod per claim), else from its status.evaluation; the "
        "row `evaluation` says which.",
    )
    parser.add_argument("jobs", nargs="+", metavar="JOB")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.add_argument(
        "--status-only",
        action="store_true",
        help="the figures of status.evaluation alone: no pod reads the claims",
    )
    add_reader_options(parser)
    kube.add_options(parser)
    parser.set_defaults(handler=run)


def status_figures(job: Mapping[str, Any]) -> tuple[list[Figure], int | None]:
    evaluation = (job.get("status") or {}).get("evaluation") or {}
    base, tuned = evaluation.get("base") or {}, evaluation.get("tuned") or {}
    names = [*base, *(name for name in tuned if name not in base)]
    step = evaluation.get("step")
    figures = [Figure(str(n), _number(base.get(n)), _number(tuned.get(n))) for n in names]
    return figures, step if isinstance(step, int) else None


def file_figures(data: bytes) -> tuple[list[Figure], int | None] | None:
    """evaluation.json's table; None where the file does not parse as one."""
    try:
        loaded = json.loads(data)
    except ValueError:
        return None
    if not isinstance(loaded, dict) or not isinstance(loaded.get("figures"), list):
        return None
    figures = [
        Figure(str(f.get("name")), _number(f.get("base")), _number(f.get("tuned")), f.get("better"))
        for f in loaded["figures"]
        if isinstance(f, dict) and f.get("name")
    ]
    step = loaded.get("step")
    return figures, step if isinstance(step, int) else None


def job_view(job: Mapping[str, Any], evaluation_file: bytes | None) -> JobView:
    name, spec = str(job["metadata"]["name"]), job.get("spec") or {}
    parsed = file_figures(evaluation_file) if evaluation_file is not None else None
    if parsed is not None:
        return JobView(name, spec, parsed[0], EVALUATION_FILE, parsed[1])
    figures, step = status_figures(job)
    return JobView(name, spec, figures, "status" if figures else "none", step)


def _read_files(cluster: kube.Cluster, jobs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, bytes]:
    """Each job's evaluation.json that its claim holds; a claim that cannot be read is noted and skipped."""
    places = {str(job["metadata"]["name"]): output_place(job) for job in jobs}
    found: dict[str, bytes] = {}
    for claim in dict.fromkeys(place.claim for place in places.values()):
        try:
            with claim_reader(cluster, claim, args) as reader:
                for name, place in places.items():
                    if place.claim == claim and (data := reader.read(place.file(EVALUATION_FILE))) is not None:
                        found[name] = data
        except CliError as exc:
            print(f"note: claim {claim} not read ({exc}); its jobs' figures are their status's", file=sys.stderr)
    return found


def run(args: argparse.Namespace) -> int:
    if len(set(args.jobs)) < 2:
        raise CliError("JOB: name two jobs or more to compare")
    cluster = kube.connect(args)
    jobs = [kube.get_job(cluster, name) for name in dict.fromkeys(args.jobs)]
    files = {} if args.status_only else _read_files(cluster, jobs, args)
    views = [job_view(job, files.get(str(job["metadata"]["name"]))) for job in jobs]
    print(render_json(views) if args.output == "json" else render_text(compare_table(views)))
    return 0

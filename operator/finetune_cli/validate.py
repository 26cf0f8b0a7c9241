"""`ftjob validate FILE...`: check FineTuneJob manifests offline with the API models, and what
the operator checks before it makes a pod: a `resources.memory` below the pod's planned host
memory (for a model the planner knows by name) is refused here as the operator refuses it.

Exit status: 0 valid, 1 a schema problem, 3 valid but the pod's memory would not hold its trainers.
"""

import argparse

from finetune_api import ManifestError, parse_file
from finetune_api.problems import format_problems
from finetune_plan.pod import memory_refusal, pod_plan

DOES_NOT_FIT = 3


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = commands.add_parser(
        "validate",
        help="check FineTuneJob YAML files offline",
        description="Check FineTuneJob YAML files with the same models the CRD is generated from.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE")
    parser.set_defaults(handler=run)


def validate_file(path: str) -> list[str]:
    """Problems as `FILE: spec.path: message` lines; empty when the file is valid."""
    try:
        documents = parse_file(path)
    except ManifestError as exc:
        return [f"{path}: {exc}"]
    lines: list[str] = []
    for doc in documents:
        source = path if len(documents) == 1 else f"{path}[{doc.index}]"
        lines.extend(format_problems(doc.problems, source))
    return lines


def fit_problems(path: str) -> list[str]:
    """`FILE: message` lines for a valid spec whose pod could not hold its trainers."""
    lines = []
    documents = parse_file(path)
    for doc in documents:
        if doc.job is None:
            continue
        source = path if len(documents) == 1 else f"{path}[{doc.index}]"
        short = memory_refusal(doc.job.spec, pod_plan(doc.job.spec).host)
        if short is not None:
            lines.append(f"{source}: WontFit: {short}")
    return lines


def run(args: argparse.Namespace) -> int:
    code = 0
    for path in args.files:
        problems = validate_file(path)
        if problems:
            code = 1
            for line in problems:
                print(line)
            continue
        short = fit_problems(path)
        for line in short:
            print(line)
        if short:
            code = code or DOES_NOT_FIT
        else:
            print(f"{path}: valid")
    return code

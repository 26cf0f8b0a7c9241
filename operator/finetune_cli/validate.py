"""`ftjob validate FILE...`: check FineTuneJob manifests offline with the API models."""

import argparse

from finetune_api import ManifestError, parse_file
from finetune_api.problems import format_problems


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


def run(args: argparse.Namespace) -> int:
    failed = False
    for path in args.files:
        problems = validate_file(path)
        if problems:
            failed = True
            for line in problems:
                print(line)
        else:
            print(f"{path}: valid")
    return 1 if failed else 0

"""`ftjob plan`'s evaluation: how many held-out examples the job measures, and their time.

The held-out examples are `--eval-examples` where given; else counted where the data is on disk
here (`--volumes`, $FTJOB_VOLUMES or the current folder: a JSON Lines file's records, any other
file or folder by its bytes at ~4 bytes per token and a row of maxLength tokens), dataset.eval's
own, or evalFraction of the training data's, as the trainer splits it; else from `--tokens`;
else not known, and the plan says how to tell it.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from finetune_api.spec import DatasetSource, FineTuneJobSpec
from finetune_plan import Plan
from finetune_plan.evaluation import EvaluationTime, evaluation_time, held_out_examples

from .errors import CliError

BYTES_PER_TOKEN = 4  # as plan.py's epoch estimate


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--eval-examples",
        type=int,
        metavar="N",
        help="held-out examples the evaluation measures (default: counted from the data under --volumes, "
        "or evalFraction of --tokens)",
    )


def _records(path: Path, max_length: int) -> int | None:
    """A data file's or folder's records: a JSON Lines file's non-blank lines, else rows of
    maxLength tokens in its bytes."""
    if path.is_file() and path.suffix == ".jsonl":
        with path.open("rb") as handle:
            return sum(1 for line in handle if line.strip())
    if path.is_file():
        size = path.stat().st_size
    elif path.is_dir():
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    else:
        return None
    return max(1, math.ceil(size / BYTES_PER_TOKEN / max_length))


def _on_disk(source: DatasetSource | None, roots: list[Path], max_length: int) -> int | None:
    if source is None or source.pvc is None:
        return None
    for root in roots:
        found = _records(root / source.pvc.claim_name / source.pvc.path, max_length)
        if found is not None:
            return found
    return None


def training_records(spec: FineTuneJobSpec, args: argparse.Namespace, roots: list[Path]) -> int | None:
    """The training data's records: on disk here, else --tokens in rows of maxLength tokens."""
    length = spec.training.max_length
    records = _on_disk(spec.dataset.source, roots, length)
    tokens: int | None = getattr(args, "tokens", None)
    return max(1, tokens // length) if records is None and tokens else records


def examples(spec: FineTuneJobSpec, args: argparse.Namespace, roots: list[Path]) -> int | None:
    """The held-out examples the job measures; None where not known here."""
    given: int | None = getattr(args, "eval_examples", None)
    if given is not None:
        if given < 1:
            raise CliError("--eval-examples: must be at least 1")
        return given
    records = training_records(spec, args, roots)
    return held_out_examples(spec, records, _on_disk(spec.dataset.eval, roots, spec.training.max_length))


def planned_steps(spec: FineTuneJobSpec, processes: int, trained: int | None) -> int | None:
    """The job's optimizer steps: maxSteps, else its epochs over the `trained` rows where known."""
    training = spec.training
    if training.max_steps is not None:
        return training.max_steps
    if trained is None:
        return None
    return max(1, math.ceil((training.epochs or 1.0) * trained / spec.effective_batch(processes)))


def timed(
    plan: Plan, spec: FineTuneJobSpec, args: argparse.Namespace, roots: list[Path], processes: int
) -> EvaluationTime | None:
    """The evaluation's time for `ftjob plan`; None without a held-out split."""
    if not spec.dataset.held_out:
        return None
    held_out = examples(spec, args, roots)
    records = training_records(spec, args, roots)
    # evalFraction's rows come out of the training data; dataset.eval's are beside it.
    trained = records if records is None or spec.dataset.eval is not None else max(1, records - (held_out or 0))
    return evaluation_time(plan, spec, held_out, total_steps=planned_steps(spec, processes, trained))

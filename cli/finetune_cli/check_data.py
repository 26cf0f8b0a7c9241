"""`ftjob check-data --format F [--tokenizer PATH] FILE`: the trainer's data check, before any GPU hour.

With --tokenizer, a model folder whose family the trainer does not train is refused in one line.
Prints every bad record as `FILE: line N: field: problem` and exits 1; a clean file prints a
one-line summary (samples, tokens, and the trained tokens: the targets of the loss, by the
trainer's own rule and `--train-on`) plus its warnings, and exits 0. `--json` prints one object
per sample on stdout instead (`{"line": N, "tokens": T, "trainedTokens": K}`); the problems, the
warnings and the summary then go to stderr. A preference record is a pair: its tokens are both
sequences', its trained tokens both answers' (the tokens DPO and ORPO score). A prompt record
(GRPO's) is its prompt's tokens, none trained (the completions sampled for it are), and a prompt
longer than `--max-length` less `--max-completion-length` is an error naming the line.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any, get_args

from finetune_api.objectives import OBJECTIVES, dataset_formats, unpacked_why
from finetune_api.objectives.grpo import PROMPT, GrpoSpec
from finetune_api.objectives.preference import PREFERENCE
from finetune_api.spec import CONVERSATION_FORMATS, TrainOn

from .errors import CliError
from .family import family_line
from .plan import read_json
from .trainer_seam import trainer


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = commands.add_parser(
        "check-data",
        help="check a training data file line by line",
        description="Check a dataset file (JSON Lines, JSON or Parquet) the way the trainer does before training: "
        "every bad line with its number and field, exit 1. With --tokenizer: samples, tokens and trained "
        "tokens, samples with 0 trained tokens as errors, replies that maxLength cuts as warnings (see "
        "Training data; for preference: pairs, both sequences' tokens and both answers' scored tokens, a pair "
        "that maxLength leaves an answer without a token as an error; for prompt: the prompts' tokens, a prompt "
        "longer than maxLength less maxCompletionLength as an error); a tokenizer folder of a family the "
        "trainer does not train is refused in one line.",
    )
    parser.add_argument("file", metavar="FILE")
    parser.add_argument(
        "--format", required=True, choices=tuple(dataset_formats()), help="spec.dataset.format (required)"
    )
    parser.add_argument("--tokenizer", metavar="PATH", help="model folder: also count tokens, check lengths")
    parser.add_argument(
        "--max-length", type=int, default=2048, metavar="L", help="tokens per sample (spec.training.maxLength)"
    )
    parser.add_argument(
        "--max-completion-length",
        type=int,
        default=GrpoSpec().max_completion_length,
        metavar="C",
        help="for --format prompt: tokens each completion may take of --max-length "
        "(spec.training.grpo.maxCompletionLength)",
    )
    parser.add_argument("--packing", action="store_true", help="as with spec.training.packing")
    parser.add_argument(
        "--train-on",
        choices=get_args(TrainOn),
        help="spec.dataset.trainOn, for messages and sharegpt (default assistant)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per sample (needs --tokenizer)")
    parser.set_defaults(handler=run)


def _load_tokenizer(path: str) -> tuple[object, object | None]:
    import os

    from finetune_api.contract import OFFLINE

    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)
    from transformers import AutoConfig, AutoTokenizer

    folder = Path(path)
    if not folder.is_dir():
        raise CliError(f"--tokenizer {path}: no such folder")
    if (folder / "config.json").is_file():  # a model the trainer would refuse: one line, before the data
        family_line(read_json(folder / "config.json", "--tokenizer"), origin=f"--tokenizer {path}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise CliError(f"--tokenizer {path}: cannot load a tokenizer: {str(exc).splitlines()[0]}") from None
    model_config = AutoConfig.from_pretrained(str(folder)) if (folder / "config.json").is_file() else None
    return tokenizer, model_config


def _options(args: argparse.Namespace) -> None:
    if args.train_on is not None and args.format not in CONVERSATION_FORMATS:
        raise CliError(f"--train-on is for the conversation formats ({', '.join(CONVERSATION_FORMATS)})")
    readers = [o for o in OBJECTIVES if args.format in o.dataset_formats]
    if args.packing and not any(o.packs for o in readers):
        raise CliError(f"--packing: the methods that read format {args.format} never pack ({unpacked_why(readers[0])})")
    if args.format == PROMPT and not 1 <= args.max_completion_length < args.max_length:
        raise CliError(
            f"--max-completion-length {args.max_completion_length}: from 1 to below --max-length {args.max_length} "
            "(a sequence is the prompt and its completion)"
        )
    if args.json and not args.tokenizer:
        raise CliError("--json prints each sample's tokens: it needs --tokenizer")


def _summary(args: argparse.Namespace, report: Any) -> str:
    # A preference record is a pair: two sequences, each answer's tokens scored.
    pairs = args.format == PREFERENCE
    noun = "pairs" if pairs else "prompts" if args.format == PROMPT else "samples"
    line = f"{args.file}: {len(report.samples)} {noun} OK ({args.format})"
    if not args.tokenizer:
        return line
    if args.format == PROMPT:
        # A prompt trains nothing itself: its completions, sampled in training, are what is trained.
        room = args.max_length - args.max_completion_length
        return (
            f"{line}: {report.tokens} prompt tokens, the longest {report.longest} (maxLength {args.max_length} "
            f"leaves {room} beside maxCompletionLength {args.max_completion_length})"
        )
    rule = f", trainOn {args.train_on or 'assistant'}" if args.format in CONVERSATION_FORMATS else ""
    if pairs:
        rule = " (the answers' tokens, chosen and rejected)"
    return f"{line}: {report.tokens} tokens, {report.trained_tokens} trained{rule}"


def run(args: argparse.Namespace) -> int:
    _options(args)
    seam = trainer("ftjob check-data")
    tokenizer, model_config = _load_tokenizer(args.tokenizer) if args.tokenizer else (None, None)
    try:
        report = seam.check_records(
            seam.read_records(Path(args.file)),
            args.format,
            tokenizer=tokenizer,
            model_config=model_config,
            max_length=args.max_length if tokenizer is not None else None,
            packing=args.packing,
            train_on=args.train_on,
            max_completion_length=args.max_completion_length if args.format == PROMPT else None,
        )
    except seam.DataSourceError as exc:
        raise CliError(str(exc)) from None
    # With --json, stdout holds the samples alone, so it can be piped into jq.
    notes = sys.stderr if args.json else sys.stdout
    if args.json:
        for count in report.counts:
            print(json.dumps(count.json(), separators=(",", ":")))
    for problem in report.problems:
        print(f"{args.file}: {problem}", file=notes)
    for warning in report.warnings:
        print(f"{args.file}: warning: {warning}", file=notes)
    if report.problems:
        if len(report.problems) > 1:  # one problem (a template's) stays one line
            print(f"{args.file}: {len(report.problems)} problem(s) in {report.total} records", file=notes)
        return 1
    print(_summary(args, report), file=notes)
    return 0

"""`ftjob make-tiny-model DIR`: a tiny random-init Llama and tokenizer, made here with no download."""

import argparse
from pathlib import Path

from .errors import CliError
from .trainer_seam import trainer


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = commands.add_parser(
        "make-tiny-model",
        help="write a tiny random-init Llama (for tests and demos)",
        description="Write a tiny random-init Llama with a locally trained tokenizer into DIR; "
        "optionally a small learnable Alpaca dataset and preference set too. Nothing is downloaded.",
    )
    parser.add_argument("dir", metavar="DIR")
    parser.add_argument("--dataset", metavar="FILE", help="also write a learnable Alpaca JSON Lines file here")
    parser.add_argument(
        "--preference",
        metavar="FILE",
        help="also write a learnable preference set (prompt/chosen/rejected strings, for dpo and orpo) here",
    )
    parser.add_argument(
        "--samples", type=int, default=256, metavar="N", help="records in --dataset and --preference (default 256)"
    )
    parser.add_argument("--hidden", type=int, default=64, metavar="N", help="hidden size (default 64)")
    parser.add_argument("--layers", type=int, default=2, metavar="N", help="decoder layers (default 2)")
    parser.add_argument("--vocab", type=int, default=512, metavar="N", help="tokenizer vocabulary (default 512)")
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="weights' and data's seed (default 0)")
    parser.add_argument(
        "--llama-tokenizer",
        action="store_true",
        help="Llama 2's kind of tokenizer, which llama.cpp's converter takes: for the GGUF formats "
        "(the default, byte-level one learns the data faster, but no converter knows it)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.hidden < 16 or args.hidden % 16:
        raise CliError(f"--hidden {args.hidden}: must be a multiple of 16 (4 heads of a 4-bit block)")
    if args.vocab < 300:
        raise CliError(f"--vocab {args.vocab}: at least 300 (256 byte tokens plus merges)")
    seam = trainer("ftjob make-tiny-model")
    folder = seam.make_tiny_model(
        Path(args.dir),
        hidden=args.hidden,
        layers=args.layers,
        vocab_size=args.vocab,
        seed=args.seed,
        llama_tokenizer=args.llama_tokenizer,
    )
    print(f"model: {folder}")
    if args.dataset:
        print(f"dataset: {seam.write_alpaca(Path(args.dataset), args.samples, args.seed)}")
    if args.preference:
        print(f"preference: {seam.write_preference(Path(args.preference), args.samples, args.seed)}")
    return 0

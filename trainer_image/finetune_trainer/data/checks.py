"""The check pass that runs before any GPU time is spent: every bad record, by line and field.

Bad data is the usual cause of a NaN hours into a run (empty strings, NUL bytes, broken
unicode, samples far over max length), and a tokenizer that does not match the model is the
usual silent failure (Llama-3's `<|begin_of_text|>` against Alpaca-era `<s>`).
"""

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .formats import normalise
from .records import Record
from .tokens import tokenize

# Special-token spellings of the common model families; finding one in the data that this
# tokenizer does not treat as special means the data was prepared for another model.
FAMILY_MARKERS = (
    "<s>",
    "</s>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
)


@dataclass(frozen=True)
class DataProblem:
    where: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.field}: {self.message}" if self.field else f"{self.where}: {self.message}"


@dataclass
class DataReport:
    total: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)
    problems: list[DataProblem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    over_length: int = 0
    longest: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> dict[str, Any]:
        return {
            "records": self.total,
            "samples": len(self.samples),
            "problems": len(self.problems),
            "overMaxLength": self.over_length,
            "longestTokens": self.longest,
            "warnings": self.warnings,
        }


def _special_tokens(tokenizer: Any) -> set[str]:
    specials = set(getattr(tokenizer, "all_special_tokens", []) or [])
    with contextlib.suppress(AttributeError, NotImplementedError):
        specials |= set(tokenizer.get_added_vocab())
    return specials


def _token_name(tokenizer: Any, token_id: int | None) -> str:
    if token_id is None:
        return "none"
    try:
        return f"{tokenizer.convert_ids_to_tokens(int(token_id))!r} (id {token_id})"
    except (ValueError, TypeError, IndexError, OverflowError):
        return f"id {token_id}"


def _ids(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, list):
        return {int(v) for v in value}
    return {int(value)}


def tokenizer_problems(tokenizer: Any, model_config: Any | None) -> list[DataProblem]:
    """The tokenizer against itself and against the model it will feed."""
    out: list[DataProblem] = []
    if tokenizer.eos_token_id is None:
        out.append(DataProblem("tokenizer", "eos_token", "no EOS token: the model would never learn to stop"))
    if model_config is None:
        return out
    vocab = getattr(model_config, "vocab_size", None)
    if vocab is not None and len(tokenizer) > vocab:
        out.append(DataProblem("tokenizer", "vocab", f"{len(tokenizer)} tokens, but the model embeds only {vocab}"))
    bos_model = _ids(getattr(model_config, "bos_token_id", None))
    if bos_model and tokenizer.bos_token_id is not None and tokenizer.bos_token_id not in bos_model:
        want = ", ".join(_token_name(tokenizer, i) for i in sorted(bos_model))
        out.append(
            DataProblem(
                "tokenizer",
                "bos_token",
                f"tokenizer BOS is {_token_name(tokenizer, tokenizer.bos_token_id)}, the model expects {want}: "
                "tokenizer and model come from different families",
            )
        )
    eos_model = _ids(getattr(model_config, "eos_token_id", None))
    if eos_model and tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos_model:
        want = ", ".join(_token_name(tokenizer, i) for i in sorted(eos_model))
        out.append(
            DataProblem(
                "tokenizer",
                "eos_token",
                f"tokenizer EOS is {_token_name(tokenizer, tokenizer.eos_token_id)}, the model expects {want}",
            )
        )
    return out


def _marker_problems(
    where: str, strings: dict[str, str], foreign: tuple[str, ...], tokenizer: Any
) -> list[DataProblem]:
    out = []
    for name, text in strings.items():
        for marker in foreign:
            if marker in text:
                out.append(
                    DataProblem(
                        where,
                        name,
                        f"contains {marker!r}, which is not a special token of this tokenizer "
                        f"(its BOS/EOS are {tokenizer.bos_token!r}/{tokenizer.eos_token!r}): the data was "
                        "prepared for another model family; remove it, the trainer adds BOS/EOS itself",
                    )
                )
                break
    return out


def check_records(
    records: Iterable[Record],
    fmt: str,
    *,
    tokenizer: Any | None = None,
    model_config: Any | None = None,
    max_length: int | None = None,
    packing: bool = False,
) -> DataReport:
    report = DataReport()
    wheres: list[str] = []
    foreign: tuple[str, ...] = ()
    if tokenizer is not None:
        report.problems.extend(tokenizer_problems(tokenizer, model_config))
        specials = _special_tokens(tokenizer)
        foreign = tuple(m for m in FAMILY_MARKERS if m not in specials)
        if fmt in ("messages", "sharegpt") and not getattr(tokenizer, "chat_template", None):
            report.problems.append(
                DataProblem(
                    "tokenizer", "chat_template", f"format {fmt} needs a chat template and the tokenizer has none"
                )
            )
    for record in records:
        report.total += 1
        if record.problem is not None:
            report.problems.append(DataProblem(record.where, "", record.problem))
            continue
        result = normalise(record.value, fmt)
        report.problems.extend(DataProblem(record.where, f, m) for f, m in result.problems)
        if result.sample is None:
            continue
        if foreign:
            found = _marker_problems(record.where, result.strings, foreign, tokenizer)
            if found:
                report.problems.extend(found)
                continue
        report.samples.append(result.sample)
        wheres.append(record.where)
    if report.total == 0:
        report.problems.append(DataProblem("dataset", "", "no records found"))
    if (
        tokenizer is not None
        and max_length is not None
        and report.samples
        and not any(p.where == "tokenizer" for p in report.problems)
    ):
        _check_lengths(report, wheres, tokenizer, max_length, packing)
    return report


def _check_lengths(report: DataReport, wheres: list[str], tokenizer: Any, max_length: int, packing: bool) -> None:
    # Counted with the trainer's own rule: (prompt tokens, total tokens) of each sample.
    lengths = [(tokens.prompt, len(tokens.input_ids)) for tokens in tokenize(report.samples, tokenizer)]
    keep: list[dict[str, Any]] = []
    for where, sample, (prompt, total) in zip(wheres, report.samples, lengths, strict=True):
        report.longest = max(report.longest, total)
        if prompt >= max_length and not packing:
            report.problems.append(
                DataProblem(
                    where,
                    "prompt",
                    f"prompt alone is {prompt} tokens, at or over maxLength {max_length}: "
                    "truncation would leave no answer token to learn from (a NaN loss)",
                )
            )
            continue
        if total > max_length:
            report.over_length += 1
        keep.append(sample)
    report.samples = keep
    if report.over_length:
        fate = "packing splits them across sequences" if packing else f"they are truncated to {max_length} tokens"
        report.warnings.append(
            f"{report.over_length} of {len(keep)} samples are longer than maxLength {max_length} tokens "
            f"(longest {report.longest}): {fate}"
        )

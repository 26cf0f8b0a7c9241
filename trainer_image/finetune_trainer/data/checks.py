"""The check pass that runs before any GPU time is spent: every bad record, by line and field.

Bad data is the usual cause of a NaN hours into a run (empty strings, NUL bytes, broken
unicode, samples far over max length), and a tokenizer that does not match the model is the
usual silent failure (Llama-3's `<|begin_of_text|>` against Alpaca-era `<s>`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .chat import DEFAULT_TRAIN_ON, TEMPLATE_FIELD
from .formats import normalise, pair_shape
from .pairs import SIDES, PairTokens, tokenize_pairs
from .prompts import prompt_ids
from .records import Record
from .tokens import IGNORE, Tokens, pieces, tokenize, trained

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

PREFERENCE = "preference"
PROMPT = "prompt"
# Samples named in one warning line; the rest are counted.
MAX_LISTED = 20
UNCUT = 2**62

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


@dataclass(frozen=True)
class SampleCount:
    """One checked sample as the trainer will see it (after maxLength cuts it): its tokens and
    the targets of its loss."""

    where: str
    tokens: int
    trained_tokens: int

    def json(self) -> dict[str, Any]:
        """`{"line": N, ...}` for a line of a JSON Lines file; a record elsewhere keeps its name."""
        kind, _, number = self.where.partition(" ")
        place: dict[str, Any] = {"line": int(number)} if kind == "line" and number.isdigit() else {"where": self.where}
        return {**place, "tokens": self.tokens, "trainedTokens": self.trained_tokens}


@dataclass
class DataReport:
    total: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)
    problems: list[DataProblem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    over_length: int = 0
    longest: int = 0
    counts: list[SampleCount] = field(default_factory=list)  # with a tokenizer: every sample tokenised

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.counts)

    @property
    def trained_tokens(self) -> int:
        return sum(c.trained_tokens for c in self.counts)

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
            "tokens": self.tokens,
            "trainedTokens": self.trained_tokens,
            "warnings": self.warnings,
        }


def _special_tokens(tokenizer: PreTrainedTokenizerBase) -> set[str]:
    specials = set(getattr(tokenizer, "all_special_tokens", []) or [])
    with contextlib.suppress(AttributeError, NotImplementedError):
        specials |= set(tokenizer.get_added_vocab())
    return specials


def _token_name(tokenizer: PreTrainedTokenizerBase, token_id: int | None) -> str:
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


def tokenizer_problems(tokenizer: PreTrainedTokenizerBase, model_config: PretrainedConfig | None) -> list[DataProblem]:
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
    where: str, strings: dict[str, str], foreign: tuple[str, ...], tokenizer: PreTrainedTokenizerBase
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


def _template_problems(tokenizer: PreTrainedTokenizerBase, what: str) -> list[DataProblem]:
    """What rendering conversations needs of the tokenizer: a chat template, and a fast tokenizer."""
    if not getattr(tokenizer, "chat_template", None):
        return [DataProblem("tokenizer", "chat_template", f"{what} needs a chat template and the tokenizer has none")]
    if not getattr(tokenizer, "is_fast", True):
        # The assistant's spans are characters of the render; only a fast tokenizer maps them to tokens.
        return [
            DataProblem(
                "tokenizer",
                "tokenizer.json",
                f"{what} needs a fast tokenizer (the model folder's tokenizer.json) to find the "
                "assistant's tokens, and this one is a slow one",
            )
        ]
    return []


def check_records(
    records: Iterable[Record],
    fmt: str,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    model_config: PretrainedConfig | None = None,
    max_length: int | None = None,
    packing: bool = False,
    train_on: str | None = None,
    max_completion_length: int | None = None,
) -> DataReport:
    """Every record of `fmt` checked, every problem listed; with a tokenizer, each sample counted
    as the trainer cuts it at `max_length`. A prompt (`fmt` prompt, GRPO) must leave
    `max_completion_length` of `max_length` to its completion."""
    report = DataReport()
    wheres: list[str] = []
    foreign: tuple[str, ...] = ()
    if tokenizer is not None:
        report.problems.extend(tokenizer_problems(tokenizer, model_config))
        specials = _special_tokens(tokenizer)
        foreign = tuple(m for m in FAMILY_MARKERS if m not in specials)
        if fmt in ("messages", "sharegpt"):
            report.problems.extend(_template_problems(tokenizer, f"format {fmt}"))
    for record in records:
        report.total += 1
        if record.problem is not None:
            report.problems.append(DataProblem(record.where, "", record.problem))
            continue
        result = normalise(record.value, fmt)
        report.problems.extend(DataProblem(record.where, f, m) for f, m in result.problems)
        if result.sample is None:
            continue
        if foreign and tokenizer is not None:  # foreign markers come from a tokenizer
            found = _marker_problems(record.where, result.strings, foreign, tokenizer)
            if found:
                report.problems.extend(found)
                continue
        report.samples.append(result.sample)
        wheres.append(record.where)
    if report.total == 0:
        report.problems.append(DataProblem("dataset", "", "no records found"))
    if fmt == PREFERENCE:
        _one_shape(report, wheres)
        chat = next(
            (w for w, s in zip(wheres, report.samples, strict=True) if pair_shape(s["prompt"]) == "messages"), None
        )
        if tokenizer is not None and chat is not None:
            report.problems.extend(_template_problems(tokenizer, f"format preference with messages ({chat})"))
    if fmt == PROMPT:
        _one_kind_per_field(report, wheres)
        chat = next((w for w, s in zip(wheres, report.samples, strict=True) if not isinstance(s["prompt"], str)), None)
        if tokenizer is not None and chat is not None:
            report.problems.extend(_template_problems(tokenizer, f"format prompt with messages ({chat})"))
    if tokenizer is not None and report.samples and not any(p.where == "tokenizer" for p in report.problems):
        # No maxLength given: nothing is cut.
        length = max_length if max_length is not None else UNCUT
        if fmt == PREFERENCE:
            _check_pairs(report, wheres, tokenizer, max_length=length)
            return report
        if fmt == PROMPT:
            _check_prompts(report, wheres, tokenizer, max_length=length, completion=max_completion_length or 0)
            return report
        _check_tokens(
            report, wheres, tokenizer, max_length=length, packing=packing, train_on=train_on or DEFAULT_TRAIN_ON
        )
    return report


def _sample_problem(where: str, problem: tuple[str, str], report: DataReport) -> None:
    if problem[0] != TEMPLATE_FIELD:
        report.problems.append(DataProblem(where, *problem))
    elif not any(p.field == TEMPLATE_FIELD for p in report.problems):
        # The template's own fault: named once, at the first sample where it shows.
        report.problems.append(DataProblem(where, *problem))


def _no_targets(tokens: Tokens, full: int, max_length: int, packing: bool, rule: str) -> tuple[str, str]:
    """Why a sample has nothing to learn from, as (field, message)."""
    if tokens.prompt >= max_length and not packing:
        return (
            "prompt",
            f"prompt alone is {tokens.prompt} tokens, at or over maxLength {max_length}: "
            "truncation would leave no answer token to learn from (a NaN loss)",
        )
    if full == 0:
        return ("", f"0 trained tokens{rule}: nothing in this sample is a target of the loss")
    return (
        "",
        f"0 trained tokens: maxLength {max_length} cuts all {full} of them "
        f"(the sample is {len(tokens.input_ids)} tokens)",
    )


def _check_tokens(
    report: DataReport,
    wheres: list[str],
    tokenizer: PreTrainedTokenizerBase,
    *,
    max_length: int,
    packing: bool,
    train_on: str,
) -> None:
    """Counted with the trainer's own rule and cut: tokens and trained tokens of every sample."""
    keep: list[dict[str, Any]] = []
    cut: list[str] = []
    for where, sample, tokens in zip(
        wheres, report.samples, tokenize(report.samples, tokenizer, train_on), strict=True
    ):
        if tokens.problem is not None:
            _sample_problem(where, tokens.problem, report)
            continue
        total, full = len(tokens.input_ids), trained(tokens.labels)
        rows = pieces(tokens.input_ids, tokens.labels, max_length, packing)
        kept = sum(trained(labels) for _, labels in rows)
        report.counts.append(SampleCount(where, sum(len(ids) for ids, _ in rows), kept))
        report.longest = max(report.longest, total)
        if kept == 0:
            rule = f" with trainOn {train_on}" if "messages" in sample else ""
            report.problems.append(DataProblem(where, *_no_targets(tokens, full, max_length, packing, rule)))
            continue
        if total > max_length:
            report.over_length += 1
        if kept < full and "messages" in sample:
            cut.append(f"{where} ({kept} of {full})")
        keep.append(sample)
    report.samples = keep
    if cut:
        shown = ", ".join(cut[:MAX_LISTED]) + (f" and {len(cut) - MAX_LISTED} more" if len(cut) > MAX_LISTED else "")
        report.warnings.append(
            f"maxLength {max_length} cuts the assistant's text of {len(cut)} sample(s) "
            f"(trained tokens left of all): {shown}"
        )
    if report.over_length:
        fate = "packing splits them across sequences" if packing else f"they are truncated to {max_length} tokens"
        report.warnings.append(
            f"{report.over_length} of {len(keep)} samples are longer than maxLength {max_length} tokens "
            f"(longest {report.longest}): {fate}"
        )


def _prompt_tokens(labels: list[int]) -> int:
    """Tokens before the answer's first target: the prompt as the pair's sequence holds it (the
    rendered turns before the answer, for messages)."""
    return next((i for i, label in enumerate(labels) if label != IGNORE), len(labels))


def _cut_answer(where: str, pair: PairTokens, max_length: int) -> DataProblem | None:
    """The problem of a pair that maxLength leaves an answer without a scored token, if it does."""
    lost = [(side, tokens) for side, tokens in zip(SIDES, pair, strict=True) if not trained(tokens.labels[:max_length])]
    if not lost:
        return None
    prompts = {_prompt_tokens(tokens.labels) for _, tokens in lost}
    if len(lost) == len(SIDES) and min(prompts) >= max_length:
        return DataProblem(
            where,
            "prompt",
            f"prompt alone is {min(prompts)} tokens, at or over maxLength {max_length}: truncation would leave "
            "neither answer a token to score",
        )
    side, tokens = lost[0]
    return DataProblem(
        where,
        side,
        f"maxLength {max_length} cuts every token of the answer: the prompt is {_prompt_tokens(tokens.labels)} "
        f"tokens of the {side} sequence's {len(tokens.input_ids)}",
    )


def _check_pairs(report: DataReport, wheres: list[str], tokenizer: PreTrainedTokenizerBase, *, max_length: int) -> None:
    """A preference pair as the trainer cuts it: each of its two sequences is cut at maxLength on
    its own (the start kept, as TRL's keep_start), and each answer must keep a scored token.
    A pair's count is both sequences' tokens, and both answers' scored tokens as trained."""
    keep: list[dict[str, Any]] = []
    cut: list[str] = []
    for where, sample, pair in zip(wheres, report.samples, tokenize_pairs(report.samples, tokenizer), strict=True):
        problems = [(side, tokens.problem) for side, tokens in zip(SIDES, pair, strict=True) if tokens.problem]
        if problems:
            side, (name, message) = problems[0]
            # A template's refusal names the conversation; here that is the answer's sequence.
            _sample_problem(where, (side if name == "messages" else name, message), report)
            continue
        kept = [trained(tokens.labels[:max_length]) for tokens in pair]
        report.counts.append(SampleCount(where, sum(min(len(t.input_ids), max_length) for t in pair), sum(kept)))
        report.longest = max(report.longest, *(len(t.input_ids) for t in pair))
        lost = _cut_answer(where, pair, max_length)
        if lost is not None:
            report.problems.append(lost)
            continue
        if any(len(t.input_ids) > max_length for t in pair):
            report.over_length += 1
            sides = [
                f"{side} {count} of {trained(tokens.labels)}"
                for side, tokens, count in zip(SIDES, pair, kept, strict=True)
                if count < trained(tokens.labels)
            ]
            cut.append(f"{where} ({', '.join(sides)})")
        keep.append(sample)
    report.samples = keep
    if report.over_length:
        shown = ", ".join(cut[:MAX_LISTED]) + (f" and {len(cut) - MAX_LISTED} more" if len(cut) > MAX_LISTED else "")
        report.warnings.append(
            f"{report.over_length} of {len(keep)} pairs have a sequence longer than maxLength {max_length} tokens "
            f"(longest {report.longest}): each is cut to its first {max_length}, the end of its answer lost "
            f"(answer tokens left of all): {shown}"
        )


def _one_shape(report: DataReport, wheres: list[str]) -> None:
    """The pairs of one file are all strings or all messages: the trainer's table (a
    `datasets.Dataset`) holds one type per column, and a file mixing them would stop it."""
    if not report.samples:
        return
    first = pair_shape(report.samples[0]["prompt"])
    keep, kept_wheres = [], []
    for where, sample in zip(wheres, report.samples, strict=True):
        shape = pair_shape(sample["prompt"])
        if shape != first:
            report.problems.append(
                DataProblem(
                    where,
                    "prompt",
                    f"{shape}, but {wheres[0]}'s pair is {first}: a file's pairs are all strings or all messages",
                )
            )
            continue
        keep.append(sample)
        kept_wheres.append(where)
    report.samples, wheres[:] = keep, kept_wheres


def _kind(name: str, value: Any) -> str | None:
    """What a record's field holds, as the trainer's table types it (None: nothing, any kind goes)."""
    if value is None:
        return None
    if name == "prompt":
        return pair_shape(value)
    kinds: tuple[tuple[type | tuple[type, ...], str], ...] = (
        (bool, "true or false"),
        (int, "an integer"),
        (float, "a number with a fraction"),
        (str, "a string"),
        (list, "a list"),
        (dict, "an object"),
    )
    return next((said for kind, said in kinds if isinstance(value, kind)), type(value).__name__)


def _one_kind_per_field(report: DataReport, wheres: list[str]) -> None:
    """Each field of a prompt file holds one kind of value in every record (or none): the
    trainer's table (a `datasets.Dataset`) keeps one type per field, and would stop at a string
    among integers, or turn every integer of the field into a number with a fraction (which an
    answer reward would not take)."""
    first: dict[str, tuple[str, str]] = {}  # field -> (its kind, the record that set it)
    keep, kept_wheres = [], []
    for where, sample in zip(wheres, report.samples, strict=True):
        problem = None
        for name, value in sample.items():
            kind = _kind(name, value)
            said = first.setdefault(name, (kind, where)) if kind is not None else None
            if said is not None and said[0] != kind:
                problem = DataProblem(
                    where,
                    name,
                    f"{kind}, but {said[1]}'s is {said[0]}: a field holds one kind of value in every record",
                )
                break
        if problem is not None:
            report.problems.append(problem)
            continue
        keep.append(sample)
        kept_wheres.append(where)
    report.samples, wheres[:] = keep, kept_wheres


def _check_prompts(
    report: DataReport, wheres: list[str], tokenizer: PreTrainedTokenizerBase, *, max_length: int, completion: int
) -> None:
    """Each prompt counted as the trainer tokenises it (`prompts.prompt_ids`); one longer than
    what maxLength leaves beside the completion is refused, naming the record. A prompt has no
    trained token: the completions sampled for it are what is trained."""
    from jinja2 import TemplateError

    room = max_length - completion
    keep: list[dict[str, Any]] = []
    for where, sample in zip(wheres, report.samples, strict=True):
        try:
            ids = prompt_ids(sample, tokenizer)
        except (TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            _sample_problem(where, ("prompt", f"the model's chat template refused these messages: {first}"), report)
            continue
        report.counts.append(SampleCount(where, len(ids), 0))
        report.longest = max(report.longest, len(ids))
        if len(ids) > room:
            report.over_length += 1
            report.problems.append(
                DataProblem(
                    where,
                    "prompt",
                    f"{len(ids)} tokens, over the {room} that maxLength {max_length} leaves beside "
                    f"maxCompletionLength {completion}: shorten it, or raise training.maxLength",
                )
            )
            continue
        keep.append(sample)
    report.samples = keep

"""Every bad-data case is named by line and field before training; `ftjob check-data` says the same.

The same check runs inside the trainer (InvalidData, see test_training) and in the CLI.
"""

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from finetune_trainer.data.checks import check_records
from finetune_trainer.data.records import read_records


def write_lines(path: Path, lines: list[bytes | str | dict[str, Any]]) -> Path:
    with path.open("wb") as handle:
        for item in lines:
            text = json.dumps(item) if isinstance(item, dict) else item
            handle.write((text.encode("utf-8") if isinstance(text, str) else text) + b"\n")
    return path


GOOD = {"instruction": "Say hi.", "input": "", "output": "hi"}


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"instruction": "Say hi.", "output": "hi"', "line 2: invalid JSON at column"),
        ({"instruction": "Say hi."}, "line 2: output: missing field"),
        ({"instruction": "Say hi.", "output": "   "}, "line 2: output: empty text"),
        ({"instruction": "Say hi.", "output": 3}, "line 2: output: expected a string, got int"),
        (b'{"instruction": "Say hi.", "output": "h\x00i"}', "line 2: NUL byte (\\x00) at column 40"),
        ({"instruction": "Say hi.", "output": "h\u0000i"}, "line 2: output: NUL character at position 2"),
        (b'{"instruction": "Say hi.", "output": "caf\xe9"}', "line 2: invalid UTF-8 at column 42"),
        ('{"instruction": "Say hi.", "output": "\\ud800"}', "line 2: output: invalid unicode (lone surrogate)"),
        ("[1, 2]", "line 2: expected a JSON object, got list"),
    ],
)
def test_each_bad_alpaca_line_is_named(tmp_path: Path, line: Any, expected: str) -> None:
    path = write_lines(tmp_path / "data.jsonl", [GOOD, line, GOOD])
    report = check_records(read_records(path), "alpaca")
    assert len(report.problems) == 1, report.problems
    assert str(report.problems[0]).startswith(expected)
    assert len(report.samples) == 2


@pytest.mark.parametrize(
    ("fmt", "record", "expected"),
    [
        ("completion", {"prompt": "2+2="}, "line 1: completion: missing field"),
        ("text", {"text": ""}, "line 1: text: empty text"),
        ("sharegpt", {"conversations": [{"from": "human", "value": "hi"}, {"from": "robot", "value": "x"}]},
         "line 1: conversations[1].from: expected one of"),
        ("sharegpt", {"conversations": [{"from": "human", "value": "hi"}]}, "line 1: conversations: no assistant turn"),
        ("messages", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]},
         "line 1: messages[1].content: empty text"),
        ("messages", {"messages": []}, "line 1: messages: expected a non-empty list of turns"),
    ],
)  # fmt: skip
def test_other_formats_name_the_field(tmp_path: Path, fmt: str, record: dict[str, Any], expected: str) -> None:
    report = check_records(read_records(write_lines(tmp_path / "d.jsonl", [record])), fmt)
    assert report.problems, "no problem reported"
    assert str(report.problems[0]).startswith(expected), report.problems


def test_json_array_and_parquet_records_are_numbered(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "d.json").write_text(json.dumps([GOOD, {"instruction": "x", "output": ""}]), encoding="utf-8")
    assert [str(p) for p in check_records(read_records(tmp_path / "d.json"), "alpaca").problems] == [
        "record 2: output: empty text"
    ]
    pq.write_table(pa.Table.from_pylist([{"text": "fine"}, {"text": ""}]), tmp_path / "d.parquet")
    assert [str(p) for p in check_records(read_records(tmp_path / "d.parquet"), "text").problems] == [
        "row 2: text: empty text"
    ]


@pytest.fixture(scope="module")
def tokenizer(tiny_assets: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_assets / "models" / "tiny-llama"))


@pytest.mark.trainer  # a Hugging Face tokenizer: transformers imports torch
def test_foreign_special_tokens_are_the_llama3_trap(tmp_path: Path, tokenizer: Any) -> None:
    # The tiny tokenizer is Llama-2 style (<s>, </s>); data prepared for Llama-3 is caught.
    path = write_lines(
        tmp_path / "d.jsonl",
        [
            GOOD,
            {"instruction": "Say hi.", "output": "hi<|end_of_text|>"},
            {"instruction": "<|begin_of_text|>Hi", "output": "x"},
        ],
    )
    problems = [str(p) for p in check_records(read_records(path), "alpaca", tokenizer=tokenizer).problems]
    assert len(problems) == 2
    assert problems[0].startswith("line 2: output: contains '<|end_of_text|>', which is not a special token")
    assert problems[1].startswith("line 3: instruction: contains '<|begin_of_text|>'")


@pytest.mark.trainer  # a Hugging Face tokenizer: transformers imports torch
def test_tokenizer_that_does_not_match_the_model(tmp_path: Path, tokenizer: Any) -> None:
    from transformers import LlamaConfig

    llama3_like = LlamaConfig(vocab_size=512, bos_token_id=128000 % 512, eos_token_id=[200, 201])
    path = write_lines(tmp_path / "d.jsonl", [GOOD])
    problems = [
        str(p)
        for p in check_records(read_records(path), "alpaca", tokenizer=tokenizer, model_config=llama3_like).problems
    ]
    assert problems[0].startswith("tokenizer: bos_token: tokenizer BOS is '<s>' (id 1), the model expects")
    assert problems[1].startswith("tokenizer: eos_token: tokenizer EOS is '</s>' (id 2)")


@pytest.mark.trainer  # a Hugging Face tokenizer: transformers imports torch
def test_over_length_samples_are_counted_and_prompt_only_overflow_fails(tmp_path: Path, tokenizer: Any) -> None:
    long_answer = " ".join(["red green blue"] * 30)
    long_prompt = " ".join(["Give the opposite of the word."] * 30)
    path = write_lines(
        tmp_path / "d.jsonl",
        [GOOD, {"instruction": "Repeat.", "output": long_answer}, {"instruction": long_prompt, "output": "x"}],
    )
    report = check_records(read_records(path), "alpaca", tokenizer=tokenizer, max_length=64)
    assert len(report.problems) == 1
    assert str(report.problems[0]).startswith("line 3: prompt: prompt alone is ")
    assert "at or over maxLength 64" in str(report.problems[0])
    assert report.over_length == 1
    assert report.warnings[0].startswith("1 of 2 samples are longer than maxLength 64 tokens")
    assert "they are truncated to 64 tokens" in report.warnings[0]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "finetune_cli", "check-data", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_check_data_cli_lists_every_bad_line_and_exits_1(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "d.jsonl", [GOOD, {"instruction": "x"}, b"\xff\xfe", "{oops"])
    result = run_cli("--format", "alpaca", str(path))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == f"{path}: line 2: output: missing field"
    assert lines[1] == f"{path}: line 3: invalid UTF-8 at column 1"
    assert lines[2].startswith(f"{path}: line 4: invalid JSON at column 2")
    assert lines[3] == f"{path}: 3 problem(s) in 4 records"
    assert "Traceback" not in result.stderr


@pytest.mark.trainer  # the CLI loads a Hugging Face tokenizer in its subprocess (transformers, torch)
def test_check_data_cli_with_tokenizer_passes_clean_data(tiny_assets: Path) -> None:
    data = tiny_assets / "datasets" / "alpaca.jsonl"
    result = run_cli("--format", "alpaca", "--tokenizer", str(tiny_assets / "models" / "tiny-llama"), str(data))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "256 samples OK (alpaca): " in result.stdout
    # alpaca trains on the answers only: fewer trained tokens than tokens
    tokens, trained = (int(n) for n in re.findall(r"(\d+) tokens, (\d+) trained$", result.stdout.strip())[0])
    assert 0 < trained < tokens


def test_check_data_cli_missing_file_is_one_line(tmp_path: Path) -> None:
    result = run_cli("--format", "text", str(tmp_path / "nope.jsonl"))
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: {tmp_path / 'nope.jsonl'}: no such file or folder"


# --- preference pairs (dpo, orpo) ----------------------------------------------------------

PAIR = {"prompt": "The opposite of hot is", "chosen": " cold.", "rejected": " hot."}
USER = [{"role": "user", "content": "What does a cow say?"}]
YES = [{"role": "assistant", "content": "A cow says moo."}]
NO = [{"role": "assistant", "content": "A cow says woof."}]


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"prompt": "Say", "chosen": " a."}, "line 2: rejected: missing field"),
        ({"chosen": " a.", "rejected": " b."}, "line 2: prompt: missing field"),
        ({"prompt": "Say", "chosen": "  ", "rejected": " b."}, "line 2: chosen: empty text"),
        ({"prompt": "Say", "chosen": " a.", "rejected": " a."}, "line 2: rejected: the same as chosen"),
        ({"prompt": USER, "chosen": YES, "rejected": YES}, "line 2: rejected: the same as chosen"),
        (
            {"prompt": "Say", "chosen": YES, "rejected": NO},
            "line 2: chosen: messages, but prompt is a string: a pair is all strings or all messages",
        ),
        (
            {"prompt": USER, "chosen": YES, "rejected": " woof."},
            "line 2: rejected: a string, but prompt is messages",
        ),
        (
            {"prompt": USER, "chosen": [{"role": "user", "content": "moo"}], "rejected": NO},
            "line 2: chosen: the last message must be the assistant's answer",
        ),
        (
            {"prompt": [{"role": "robot", "content": "hi"}], "chosen": YES, "rejected": NO},
            "line 2: prompt[0].role: expected one of assistant, system, tool, user, got 'robot'",
        ),
        ({"prompt": USER, "chosen": [], "rejected": NO}, "line 2: chosen: expected a string or a non-empty list"),
        ({"prompt": "Say", "chosen": 3, "rejected": " b."}, "line 2: chosen: expected a string or a non-empty"),
        (
            {"prompt": USER, "chosen": [{"role": "assistant", "content": ""}], "rejected": NO},
            "line 2: chosen[0].content: empty text",
        ),
    ],
)
def test_each_bad_preference_line_is_named(tmp_path: Path, record: dict[str, Any], expected: str) -> None:
    good = PAIR if isinstance(record.get("prompt", ""), str) else {"prompt": USER, "chosen": YES, "rejected": NO}
    report = check_records(read_records(write_lines(tmp_path / "d.jsonl", [good, record, good])), "preference")
    assert [str(p) for p in report.problems][:1] and str(report.problems[0]).startswith(expected), report.problems
    assert len(report.problems) == 1 and len(report.samples) == 2


def test_a_pair_of_messages_may_be_one_object_each_and_a_longer_prompt() -> None:
    from finetune_trainer.data.records import Record

    records = [
        Record("line 1", {"prompt": USER, "chosen": YES[0], "rejected": NO[0]}),
        # Turns before the answer's last one join the prompt; the prompt may end with an assistant turn.
        Record("line 2", {"prompt": [*USER, *YES, *USER], "chosen": YES, "rejected": [*USER, *NO]}),
    ]
    report = check_records(records, "preference")
    assert report.ok, report.problems
    assert report.samples[0] == {"prompt": USER, "chosen": YES, "rejected": NO}


def test_a_file_mixing_string_and_message_pairs_is_refused_at_the_odd_lines(tmp_path: Path) -> None:
    chat = {"prompt": USER, "chosen": YES, "rejected": NO}
    report = check_records(read_records(write_lines(tmp_path / "d.jsonl", [PAIR, chat, PAIR, chat])), "preference")
    assert [str(p) for p in report.problems] == [
        f"line {n}: prompt: messages, but line 1's pair is a string: a file's pairs are all strings or all messages"
        for n in (2, 4)
    ]
    assert len(report.samples) == 2


@pytest.mark.trainer  # a Hugging Face tokenizer, and the trainer's pair rows (torch)
@pytest.mark.parametrize("chat", [False, True], ids=["strings", "messages"])
def test_the_pair_check_counts_what_the_trainer_scores(tmp_path: Path, tokenizer: Any, chat: bool) -> None:
    from finetune_trainer.model.tiny_model import write_preference
    from finetune_trainer.objectives.preference import pair_rows

    path = write_preference(tmp_path / "pairs.jsonl", count=12, chat=chat)
    report = check_records(read_records(path), "preference", tokenizer=tokenizer, max_length=128)
    assert report.ok and not report.warnings, (report.problems, report.warnings)
    rows = pair_rows(report.samples, tokenizer, 128)
    assert [c.tokens for c in report.counts] == [r.tokens for r in rows]
    # Trained: both answers' scored tokens (the answer and its end: EOS, or the template's end of turn).
    assert [c.trained_tokens for c in report.counts] == [r.chosen.targets + r.rejected.targets for r in rows]
    assert all(r.chosen.targets >= 2 and r.rejected.targets >= 2 for r in rows)
    assert report.summary()["samples"] == 12


@pytest.mark.trainer  # a Hugging Face tokenizer: transformers imports torch
def test_pairs_maxlength_cuts_are_named_by_side_or_prompt(tmp_path: Path, tokenizer: Any) -> None:
    long_prompt = " ".join(["Give the opposite of the word."] * 20)
    long_answer = " " + " ".join(["red green blue"] * 20)
    path = write_lines(
        tmp_path / "d.jsonl",
        [
            PAIR,
            {"prompt": long_prompt, "chosen": " cold.", "rejected": " hot."},
            {"prompt": "Repeat.", "chosen": long_answer, "rejected": " no."},
            {"prompt": long_prompt[:60], "chosen": long_answer, "rejected": " no."},
        ],
    )
    report = check_records(read_records(path), "preference", tokenizer=tokenizer, max_length=32)
    problems = [str(p) for p in report.problems]
    assert len(problems) == 1, problems
    assert problems[0].startswith("line 2: prompt: prompt alone is ")
    assert "at or over maxLength 32: truncation would leave neither answer a token to score" in problems[0]
    # The long answers of lines 3 and 4 keep their start; their rejected answers fit.
    assert report.over_length == 2 and len(report.samples) == 3
    (warning,) = report.warnings
    assert warning.startswith("2 of 3 pairs have a sequence longer than maxLength 32 tokens")
    assert "line 3 (chosen " in warning and "line 4 (chosen " in warning and "rejected" not in warning
    # Messages: the turns before an answer's last one are its prompt, so one side alone can lose its answer.
    side = {"prompt": USER, "chosen": [{"role": "user", "content": long_prompt}, *YES], "rejected": NO}
    records = read_records(write_lines(tmp_path / "c.jsonl", [side]))
    chat = check_records(records, "preference", tokenizer=tokenizer, max_length=64)
    assert [p.field for p in chat.problems] == ["chosen"], chat.problems
    assert str(chat.problems[0]).startswith("line 1: chosen: maxLength 64 cuts every token of the answer: the prompt")


@pytest.mark.trainer  # a Hugging Face tokenizer: transformers imports torch
def test_message_pairs_need_the_models_chat_template(tmp_path: Path, tiny_assets: Path) -> None:
    from transformers import AutoTokenizer

    from finetune_trainer.model.tiny_model import write_preference

    no_template = AutoTokenizer.from_pretrained(str(tiny_assets / "models" / "tiny-llama"))
    no_template.chat_template = None
    chat = write_preference(tmp_path / "chat.jsonl", count=4, chat=True)
    report = check_records(read_records(chat), "preference", tokenizer=no_template, max_length=128)
    assert [str(p) for p in report.problems] == [
        "tokenizer: chat_template: format preference with messages (line 1) needs a chat template and the "
        "tokenizer has none"
    ]
    strings = write_preference(tmp_path / "strings.jsonl", count=4)
    assert check_records(read_records(strings), "preference", tokenizer=no_template, max_length=128).ok


def test_check_data_cli_names_bad_pairs_and_exits_1(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "d.jsonl", [PAIR, {"prompt": "x", "chosen": " y"}, {**PAIR, "rejected": " cold."}])
    result = run_cli("--format", "preference", str(path))
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{path}: line 2: rejected: missing field",
        f"{path}: line 3: rejected: the same as chosen: nothing to prefer",
        f"{path}: 2 problem(s) in 3 records",
    ]
    packed = run_cli("--format", "preference", "--packing", str(path))
    assert packed.returncode == 1 and packed.stderr.startswith("error: --packing: "), packed.stderr


@pytest.mark.trainer  # the CLI loads a Hugging Face tokenizer in its subprocess (transformers, torch)
def test_check_data_cli_summarises_pairs(tmp_path: Path, tiny_assets: Path) -> None:
    from finetune_trainer.model.tiny_model import write_preference

    data = write_preference(tmp_path / "pairs.jsonl", count=16)
    model = str(tiny_assets / "models" / "tiny-llama")
    result = run_cli("--format", "preference", "--tokenizer", model, str(data))
    assert result.returncode == 0, result.stdout + result.stderr
    found = re.findall(r": 16 pairs OK \(preference\): (\d+) tokens, (\d+) trained \(the answers'", result.stdout)
    tokens, trained = (int(n) for n in found[0])
    assert 0 < trained < tokens
    as_json = run_cli("--format", "preference", "--tokenizer", model, "--json", str(data))
    lines = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [line["line"] for line in lines] == list(range(1, 17))
    assert sum(line["tokens"] for line in lines) == tokens
    assert sum(line["trainedTokens"] for line in lines) == trained
    assert "16 pairs OK (preference)" in as_json.stderr

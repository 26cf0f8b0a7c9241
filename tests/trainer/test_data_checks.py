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

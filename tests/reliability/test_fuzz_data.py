"""Fuzzed dataset files through `ftjob check-data` (and, once, through the trainer itself):
every planted problem reported with its line, zero tracebacks.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from finetune_cli.errors import CliError
from finetune_cli.main import build_parser
from tests.support.tiers import fuzz_corpus

from .data_strategies import DataCase, data_cases

CI_FILES = 200
SOAK_FILES = 1000
LINE = re.compile(r": line (\d+): ")


def check_data(path: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """Run the command's handler in-process; any exception but CliError fails the test with its traceback."""
    args = build_parser().parse_args(["check-data", "--format", fmt, str(path)])
    capsys.readouterr()
    try:
        code = args.handler(args)
    except CliError as exc:
        message = str(exc)
        assert "\n" not in message, message
        return 2, [f"error: {message}"]
    out = capsys.readouterr().out
    return code, out.splitlines()


def check_report(path: Path, case: DataCase, code: int, lines: list[str]) -> None:
    reported: set[int] = set()
    for line in lines:
        assert "Traceback" not in line
        assert line.startswith(f"{path}: "), f"line does not name the file: {line!r}"
        match = LINE.search(line)
        if match:
            reported.add(int(match.group(1)))
        elif not line.endswith(("samples OK (" + case.fmt + ")", "records")) and ": warning: " not in line:
            raise AssertionError(f"problem without a line number: {line!r}")
    missing = sorted(case.bad - reported)
    assert not missing, f"{case.fmt}: planted problems on lines {missing} not reported ({case.kinds}); got {lines}"
    if case.bad:
        assert code == 1, f"exit {code} with bad lines {sorted(case.bad)}"


def fuzz_files(folder: Path, count: int, capsys: pytest.CaptureFixture[str]) -> int:
    checked = 0

    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(case=data_cases())
    def one(case: DataCase) -> None:
        nonlocal checked
        path = folder / f"data-{checked}.jsonl"
        path.write_bytes(case.content())
        code, lines = check_data(path, case.fmt, capsys)
        check_report(path, case, code, lines)
        checked += 1

    one()
    return checked


def test_fuzzed_data_files_report_every_bad_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    files = fuzz_corpus(request.config.option.markexpr or "", CI_FILES)
    assert fuzz_files(tmp_path, files, capsys) >= files


@pytest.mark.soak
def test_fuzzed_data_corpus_full(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checked = fuzz_files(tmp_path, SOAK_FILES, capsys)
    assert checked >= SOAK_FILES
    with capsys.disabled():
        print(f"fuzz data: {checked} files checked, every planted problem reported by line, 0 tracebacks")


def test_check_data_command_end_to_end(tmp_path: Path) -> None:
    """The real command in its own process: exit 1, the lines, no traceback."""
    path = tmp_path / "bad.jsonl"
    path.write_bytes(
        b'{"instruction": "a", "output": "b"}\n'
        b'{"instruction": "a", "output": \n'
        b'{"instruction": "a\x00", "output": "b"}\n'
        b'{"instruction": "\xff", "output": "b"}\n'
        b'{"instruction": "", "output": "b"}\n'
        b'{"output": "b"}\n'
        b'{"instruction": "x\\ud800", "output": "b"}\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "finetune_cli", "check-data", "--format", "alpaca", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in result.stdout + result.stderr
    assert result.returncode == 1, result.stdout + result.stderr
    reported = {int(m.group(1)) for m in LINE.finditer(result.stdout)}
    assert reported == {2, 3, 4, 5, 6, 7}, result.stdout


def trainer_config(model: Path, data: Path, output: Path, fmt: str) -> dict[str, object]:
    return {
        "jobName": "fuzz-data",
        "spec": {
            "model": {"source": {"pvc": {"claimName": "models"}}},
            "dataset": {"source": {"pvc": {"claimName": "datasets"}}, "format": fmt},
            "output": {"pvc": {"claimName": "outputs"}},
            "precision": "fp32",
            "training": {"maxSteps": 1, "maxLength": 64},
            "resources": {"gpus": 0},
        },
        "paths": {"model": str(model), "dataset": str(data), "output": str(output)},
    }


@pytest.mark.soak
def test_trainer_refuses_fuzzed_data_with_its_lines(tmp_path: Path) -> None:
    """The trainer's own pre-flight: exit InvalidData, every bad line in the termination message."""
    model = tmp_path / "model"
    subprocess.run(
        [sys.executable, "-m", "finetune_cli", "make-tiny-model", str(model)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    data = tmp_path / "data.jsonl"
    data.write_bytes(
        b'{"text": "fine"}\n{"text": ""}\n{"text": "a\x00b"}\n{"txt": "typo"}\n{"text": 5}\n[1, 2]\n{"text": "\xfe"}\n'
    )
    config = tmp_path / "config.json"
    config.write_text(json.dumps(trainer_config(model, data, tmp_path / "out", "text")))
    termination = tmp_path / "termination-log"
    result = subprocess.run(
        [sys.executable, "-m", "finetune_trainer", "--config", str(config), "--termination-log", str(termination)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert "Traceback" not in result.stdout + result.stderr, result.stderr[-3000:]
    assert result.returncode == 11, f"exit {result.returncode}: {result.stderr[-2000:]}"
    message = termination.read_text()
    assert message.startswith("InvalidData: "), message
    for number in (2, 3, 4, 5, 6, 7):
        assert f"line {number}" in message, f"line {number} missing from: {message}"

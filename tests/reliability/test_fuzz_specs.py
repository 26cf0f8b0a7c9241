"""Fuzzed FineTuneJob specs through `ftjob validate`: each is valid, or one line naming the field.

The short version runs in `make test` (a quarter of it in `make test-fast`); the soak version
does the full corpus of 1000+.
"""

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from finetune_cli.validate import validate_file
from tests.support.tiers import fuzz_corpus

from .spec_strategies import SpecCase, dotdot_cases, manifest, spec_cases

CI_EXAMPLES = 200
SOAK_EXAMPLES = 1200


def write_case(folder: Path, index: int, case: SpecCase) -> Path:
    path = folder / f"case-{index:05d}.yaml"
    path.write_text(yaml.safe_dump(manifest(f"fuzz-{index}", case.spec), allow_unicode=True), encoding="utf-8")
    return path


def check_lines(path: Path, case: SpecCase, lines: list[str]) -> None:
    """The contract of `ftjob validate` for one file, given what the case expects."""
    for line in lines:
        assert line.startswith(f"{path}: "), f"problem line does not name the file: {line!r}"
        assert "\n" not in line, f"problem spans several lines: {line!r} ({case.what})"
        assert "Traceback" not in line
    if case.expect == "valid":
        assert lines == [], f"valid spec refused ({case.what}): {lines}"
    elif case.expect == "invalid":
        assert lines, f"invalid spec accepted ({case.what}): {case.spec!r:.300}"
        assert any(case.field in line for line in lines), f"no problem names {case.field} ({case.what}): {lines}"


def run_corpus(folder: Path, examples: int) -> tuple[list[tuple[Path, SpecCase]], Counter[str]]:
    corpus: list[tuple[Path, SpecCase]] = []
    kinds: Counter[str] = Counter()

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(case=spec_cases())
    def one(case: SpecCase) -> None:
        path = write_case(folder, len(corpus), case)
        corpus.append((path, case))
        kinds[case.expect] += 1
        check_lines(path, case, validate_file(str(path)))

    one()
    return corpus, kinds


def check_cli(corpus: list[tuple[Path, SpecCase]]) -> None:
    """The whole corpus in one `ftjob validate` process: a line per file, no traceback, no crash."""
    result = subprocess.run(
        [sys.executable, "-m", "finetune_cli", "validate", *(str(p) for p, _ in corpus)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert "Traceback" not in result.stdout + result.stderr, result.stderr[-3000:]
    assert result.returncode in (0, 1), f"exit {result.returncode}: {result.stderr[-2000:]}"
    assert not result.stderr.strip(), f"stderr: {result.stderr[-2000:]}"
    by_file: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        name = line.split(": ", 1)[0]
        by_file.setdefault(name, []).append(line)
    for path, case in corpus:
        lines = by_file.get(str(path))
        assert lines, f"{path}: no output line ({case.what})"
        # A valid job a server would refuse as it is gets warning lines after its "valid" (vLLM's
        # LoRA rank limit); they are one line each and never a problem.
        warnings = [line for line in lines if line.startswith(f"{path}: warning: ")]
        assert all("\n" not in line and "Traceback" not in line for line in warnings), warnings
        rest = [line for line in lines if line not in warnings]
        problems = [] if rest == [f"{path}: valid"] else rest
        check_lines(path, case, problems)


def test_fuzzed_specs_get_one_line_per_problem(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    examples = fuzz_corpus(request.config.option.markexpr or "", CI_EXAMPLES)
    corpus, kinds = run_corpus(tmp_path, examples)
    assert len(corpus) >= examples
    assert kinds["valid"] and kinds["invalid"], kinds
    check_cli(corpus)


@pytest.mark.soak
def test_fuzzed_spec_corpus_full(tmp_path: Path) -> None:
    corpus, kinds = run_corpus(tmp_path, SOAK_EXAMPLES)
    assert len(corpus) >= 1000, kinds
    check_cli(corpus)
    print(f"fuzz specs: {len(corpus)} checked offline ({dict(kinds)}), 0 tracebacks")


@given(text=st.text(max_size=400))
@settings(max_examples=100, deadline=None, database=None)
def test_arbitrary_text_is_never_a_traceback(text: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Not even YAML: still one line (or a set of lines naming fields), never an exception."""
    path = tmp_path_factory.mktemp("text") / "job.yaml"
    path.write_text(text, encoding="utf-8")
    lines = validate_file(str(path))
    for line in lines:
        assert line.startswith(f"{path}: ") and "\n" not in line, line


@pytest.mark.parametrize("path", ["..", "../x", "a/../../etc", "a/..", "./.."])
@pytest.mark.parametrize("where", ["model", "dataset", "output"])
def test_paths_cannot_leave_their_claim(path: str, where: str, tmp_path: Path) -> None:
    """spec paths are relative to a claim and may never climb out of it (base.py promises no `..`)."""
    case = next(c for c in dotdot_cases(path) if c.field and where in c.field)
    file = write_case(tmp_path, 0, case)
    check_lines(file, case, validate_file(str(file)))

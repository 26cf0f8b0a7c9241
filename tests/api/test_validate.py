"""`ftjob validate`: valid examples pass; each wrong spec fails naming the field."""

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api import parse_file
from finetune_cli.main import main
from tests.support.api_cases import TINY, WRONG_SPECS, tiny_with

ROOT = Path(__file__).resolve().parents[2]
# Every FineTuneJob and ModelServer manifest under examples/, its sub-folders too.
EXAMPLES = sorted(
    p
    for p in (ROOT / "examples").rglob("*.yaml")
    if any(f"kind: {k}" in p.read_text() for k in ("FineTuneJob", "ModelServer"))
)
# The other files there, and the test that validates each against what reads it.
VALIDATED_ELSEWHERE = {
    "kueue/queues.yaml": "tests/operator/test_e2e_kueue.py (applied through Kueue's own admission)",
    "kueue/README.md": "prose",
    "eval-tasks/_answers_template": "tests/cli/test_eval_command.py (ftjob eval: built by lm-evaluation-harness)",
    "eval-tasks/cow.yaml": "tests/cli/test_eval_command.py (ftjob eval: built by lm-evaluation-harness)",
    "eval-tasks/cow.jsonl": "tests/cli/test_eval_command.py (ftjob eval: the cow task's data)",
    "eval-tasks/colours.yaml": "tests/cli/test_eval_command.py (ftjob eval: built by lm-evaluation-harness)",
    "eval-tasks/colours.jsonl": "tests/cli/test_eval_command.py (ftjob eval: the colours task's data)",
    "data/arithmetic.jsonl": "tests/trainer/test_prompt_checks.py (check-data --format prompt: grpo-job.yaml's data)",
}


def _write(tmp_path: Path, body: Any, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(body if isinstance(body, str) else yaml.safe_dump(body))
    return path


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT / "examples")))
def test_examples_are_valid(
    example: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # No cluster: a ModelServer's jobs and claims are checked only where one is reachable.
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["validate", str(example)]) == 0
    valid, *notes = capsys.readouterr().out.strip().splitlines()
    assert valid == f"{example}: valid"
    server = yaml.safe_load(example.read_text())["kind"] == "ModelServer"
    assert [n.split(": note: ")[1].startswith("not checked on a cluster") for n in notes] == ([True] if server else [])


def test_every_file_in_examples_is_validated() -> None:
    folder = ROOT / "examples"
    files = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    manifests = {str(p.relative_to(folder)) for p in EXAMPLES}
    assert files - manifests == set(VALIDATED_ELSEWHERE), "a file in examples/ nothing validates"
    assert {"kueue/nightly-job.yaml", "kueue/urgent-job.yaml", "tiny-job.yaml"} <= manifests


@pytest.mark.parametrize(("case", "change", "expected"), WRONG_SPECS, ids=[c[0] for c in WRONG_SPECS])
def test_wrong_specs_name_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, change: dict[str, Any], expected: str
) -> None:
    path = _write(tmp_path, tiny_with(change))
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}: " in out
    assert expected in out, out


PREFERENCE_CASES = [
    c
    for c in WRONG_SPECS
    if c[0]
    in {
        "preference method on alpaca",
        "sft on preference data",
        "dpo settings with sft",
        "packing with orpo",
        "pairSplit with sft",
        "grpo on alpaca",
        "grpo settings with sft",
        "packing with grpo",
        "grpo with evalFraction",
    }
]


@pytest.mark.parametrize(("case", "change", "expected"), PREFERENCE_CASES, ids=[c[0] for c in PREFERENCE_CASES])
def test_a_method_its_data_and_its_settings_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, change: dict[str, Any], expected: str
) -> None:
    path = _write(tmp_path, tiny_with(change))
    assert main(["validate", str(path)]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"{path}: spec") and line.endswith(expected), line


@pytest.mark.parametrize(
    "change",
    [
        {"resources": {"processes": 4}, "training": {"parallelism": "fsdp"}},
        {"resources": {"processes": 2}, "training": {"parallelism": "dataParallel"}},
        {"resources": {"processes": 1}, "training": {"parallelism": "deviceMap"}},
        {"resources": {"gpus": 4, "processes": 1}},
        {"resources": {"gpus": 2}, "training": {"parallelism": "deviceMap"}},
        {"resources": {"gpus": 2, "nodes": 1}, "training": {"parallelism": "deviceMap"}},
        {"resources": {"gpus": 4, "nodes": 2}, "training": {"parallelism": "fsdp"}},
        {"resources": {"gpus": 0, "nodes": 2, "processes": 2}},
        {"resources": {"nodes": 64}},
    ],
    ids=[
        "cpu fsdp",
        "cpu dataParallel",
        "cpu deviceMap one process",
        "gpus one process",
        "gpus deviceMap",
        "deviceMap on one node",
        "fsdp on two nodes",
        "cpu processes on two nodes",
        "most nodes",
    ],
)
def test_parallelism_and_processes_that_make_sense(tmp_path: Path, change: dict[str, Any]) -> None:
    assert main(["validate", str(_write(tmp_path, tiny_with(change)))]) == 0


@pytest.mark.parametrize(
    "change",
    [
        {"training": {"keptLayers": 2}},
        {"training": {"keptLayers": 0, "activationOffload": True}},
        {"training": {"activationOffload": "inputs"}},
        {"training": {"gradientCheckpointing": True, "activationOffload": "inputs"}},
        {"training": {"method": "dpo", "pairSplit": True}, "dataset": {"format": "preference"}},
        {"training": {"method": "orpo", "pairSplit": False}, "dataset": {"format": "preference"}},
        {"training": {"pairSplit": False}},
    ],
    ids=["kept", "none kept, offloaded", "inputs", "inputs of every layer", "dpo split", "orpo unsplit", "sft unsplit"],
)
def test_the_layers_kept_the_inputs_offloaded_and_the_pair_split_a_spec_may_ask(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    assert main(["validate", str(_write(tmp_path, tiny_with(change)))]) == 0


def test_parallelism_defaults_to_auto_and_processes_to_unset() -> None:
    job = parse_file(ROOT / "examples" / "tiny-job.yaml")[0].job
    assert job is not None
    assert job.spec.training.parallelism == "auto" and job.spec.resources.processes is None
    assert job.spec.resources.nodes == 1


def test_bf16_on_a_newer_gpu_is_fine(tmp_path: Path) -> None:
    path = _write(
        tmp_path, tiny_with({"precision": "bf16", "resources": {"gpus": 1, "gpuProduct": "NVIDIA-A100-SXM4-80GB"}})
    )
    assert main(["validate", str(path)]) == 0


def test_every_problem_is_reported_not_just_the_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, tiny_with({"lora": {"r": 0, "alpha": -1}, "checkpoints": {"keep": 0}}))
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    for field in ("spec.lora.r", "spec.lora.alpha", "spec.checkpoints.keep"):
        assert field in out


def test_mixed_files_report_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path, TINY, "good.yaml")
    bad = _write(tmp_path, tiny_with({"lora": {"r": 0}}), "bad.yaml")
    assert main(["validate", str(good), str(bad)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert f"{good}: valid" in out
    assert any(line.startswith(f"{bad}: spec.lora.r:") for line in out)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("spec: [unclosed\n", "line 2"),
        ("just a string\n", "expected a mapping"),
        ("apiVersion: v1\nkind: Pod\nspec: {}\n", "expected apiVersion finetune.dev/v1alpha1"),
        ("", "no YAML documents"),
        ("\x00\x01", "invalid YAML"),
    ],
)
def test_unreadable_files_get_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    path = _write(tmp_path, text)
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert expected in out and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1


def test_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "/nonexistent/job.yaml"]) == 1
    assert capsys.readouterr().out.strip() == "/nonexistent/job.yaml: no such file"


def test_console_script_never_prints_a_traceback(tmp_path: Path) -> None:
    path = _write(tmp_path, "spec: {lora: {r: 0}\n")
    result = subprocess.run(
        [sys.executable, "-m", "finetune_cli", "validate", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr

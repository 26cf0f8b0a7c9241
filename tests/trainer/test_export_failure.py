"""An output format that cannot be written after training costs the format, not the run: the
adapter and the checkpoints stay, the trainer exits 0 saying which format and why
(`ExportFailed: merged: <cause>`, read by the operator's Exported condition), and
`--export-only` (`ftjob export`) writes it later from the saved adapter, on the CPU."""

import json
import os
import subprocess
import sys

import pytest

from finetune_api.contract import EXPORT_ONLY_FLAG, MERGED_DIR
from finetune_api.reasons import ExitReason
from tests.support.faults import faults_env
from tests.support.trainer_faults import EXPORT_FAIL
from tests.trainer.conftest import JobDir

pytestmark = pytest.mark.trainer

INJECTED = f"merged: injected export failure ({EXPORT_FAIL})"


def export_only(job: JobDir, *extra: str, env: dict[str, str] | None = None) -> tuple[int, str, list[dict]]:
    termination = job.root / "termination-log"
    termination.unlink(missing_ok=True)
    command = [sys.executable, "-m", "finetune_trainer", "--config", str(job.config_path()), EXPORT_ONLY_FLAG, *extra]
    done = subprocess.run(
        [*command, "--termination-log", str(termination)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, **(env or {})},
    )
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    said = termination.read_text(encoding="utf-8") if termination.exists() else ""
    return done.returncode, said, events


def test_a_failed_export_keeps_the_adapter_and_export_only_writes_it_later(job_dir: JobDir) -> None:
    job_dir.spec_changes = {
        "training": {"maxSteps": 2},
        "checkpoints": {"everySteps": 2},
        "output": {"formats": ["merged"], "samples": {"count": 0}},
    }
    run = job_dir.run(env=faults_env(**{EXPORT_FAIL: "merged"}), timeout=600)
    assert run.code == 0, run.stderr[-3000:]
    assert run.termination == f"ExportFailed: {INJECTED}"
    adapter = job_dir.output / "adapter"
    assert (adapter / "adapter_config.json").is_file()
    assert list(job_dir.checkpoints.glob("checkpoint-*"))
    assert not (job_dir.output / MERGED_DIR).exists()
    summary = json.loads((job_dir.output / "summary.json").read_text())
    assert summary["exportFailures"] == {"merged": INJECTED.partition(": ")[2]}
    assert summary["formats"] == {"peft": str(adapter)}

    # Still failing: one line naming the format, the adapter untouched.
    code, said, _ = export_only(job_dir, env=faults_env(**{EXPORT_FAIL: "merged"}))
    assert code == ExitReason.InvalidConfig
    assert said == f"InvalidConfig: spec.output.formats: {INJECTED}"
    # Mended: the format is written from the saved adapter and the summary says so.
    code, said, events = export_only(job_dir)
    assert (code, said) == (0, "")
    (exported,) = [e for e in events if e["event"] == "exported"]
    merged = job_dir.output / MERGED_DIR
    assert exported["formats"] == {"merged": str(merged)}
    assert (merged / "config.json").is_file() and list(merged.glob("*.safetensors"))
    summary = json.loads((job_dir.output / "summary.json").read_text())
    assert summary["exportFailures"] is None
    assert summary["formats"] == {"peft": str(adapter), "merged": str(merged)}
    assert summary["finalStep"] == 2  # the run's own record kept


def test_export_only_refuses_a_format_the_job_does_not_write_and_a_job_without_an_adapter(job_dir: JobDir) -> None:
    job_dir.spec_changes = {"output": {"formats": ["merged"]}}
    code, said, _ = export_only(job_dir, "--formats", "gguf")
    assert code == ExitReason.InvalidConfig
    assert said.startswith("InvalidConfig: spec.output: ") and said.endswith(
        "/outputs/tiny/adapter: no adapter to export (has the job finished training?)"
    )
    (job_dir.output / "adapter").mkdir(parents=True)
    (job_dir.output / "adapter" / "adapter_config.json").write_text("{}")
    code, said, _ = export_only(job_dir, "--formats", "gguf")
    assert (code, said) == (
        ExitReason.InvalidConfig,
        "InvalidConfig: --formats: gguf: not among the job's formats (peft, merged)",
    )

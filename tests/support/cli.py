"""Run `ftjob` the way a user does: a separate process with its real entry point."""

import os
import subprocess
import sys
from pathlib import Path

from tests.support.layers import SOURCE_ROOTS

REPO = Path(__file__).resolve().parents[2]
# Works with the editable install and with a bare checkout alike.
PYTHONPATH = os.pathsep.join(str(root) for root in SOURCE_ROOTS)


def ftjob(*args: str, env: dict[str, str] | None = None, timeout: float = 120, cwd: Path | None = None):
    merged = {**os.environ, **(env or {})}
    merged["PYTHONPATH"] = os.pathsep.join(p for p in (PYTHONPATH, merged.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "finetune_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=merged,
        cwd=cwd or REPO,
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str, on_stdout: bool = False) -> str:
    """Non-zero exit, exactly one line on stderr (or on stdout, where a command reports a
    problem with its input as its result), no traceback; returns that line."""
    assert result.returncode != 0, result.stdout
    text = result.stdout if on_stdout else result.stderr
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]

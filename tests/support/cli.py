"""Run `ftjob` the way a user does: its real entry point, `finetune_cli.main.main`, with the
user's arguments, exit code, stdout and stderr.

Two ways, one result type (`subprocess.CompletedProcess`):
- `ftjob` calls the entry point in the test's own process. The fast tier runs a hundred CLI
  calls, and a new process pays about half a second of CPU for Python and pydantic each time;
  in-process the code, the arguments and what a user reads are the same. What a process adds
  (the console script, `python -m`) is held by `ftjob_process`, which the entry-point tests use.
- `ftjob_process` runs `python -m finetune_cli` as a separate process: for commands that talk to
  the cluster (they follow, port-forward or wait with timeouts, and a test may interrupt them),
  and for what only a process shows (no traceback on stderr when everything else failed).
"""

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from tests.support.layers import SOURCE_ROOTS

REPO = Path(__file__).resolve().parents[2]
# Works with the editable install and with a bare checkout alike.
PYTHONPATH = os.pathsep.join(str(root) for root in SOURCE_ROOTS)


def ftjob_process(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
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


@contextlib.contextmanager
def _environment(changes: Mapping[str, str], cwd: Path) -> Iterator[None]:
    """`changes` in os.environ and `cwd` as the working folder, both undone afterwards (a test
    worker runs one test at a time, so nothing else sees them meanwhile)."""
    saved = {name: os.environ.get(name) for name in changes}
    before = Path.cwd()
    os.environ.update(changes)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(before)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def ftjob(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    from finetune_cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with _environment(env or {}, cwd or REPO), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse's usage errors and --help end this way
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
            if isinstance(exit_.code, str):
                print(exit_.code, file=sys.stderr)
    return subprocess.CompletedProcess(["ftjob", *args], code, out.getvalue(), err.getvalue())


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

"""Start the cluster's daemons detached from the caller, remember them by pid, stop them by pid.

A pid file holds the pid and the executable it was started as; `stop` checks that executable
against /proc before signalling, so a recycled pid is never killed by mistake.
"""

import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .layout import Layout


def start(layout: Layout, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """Run `argv` in its own session with output in logs/<name>.log; record its pid."""
    layout.logs.mkdir(parents=True, exist_ok=True)
    layout.pids.mkdir(parents=True, exist_ok=True)
    with (layout.logs / f"{name}.log").open("ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            cwd=layout.repo,
        )
    record = {"pid": proc.pid, "exe": os.path.realpath(argv[0]) if os.path.sep in argv[0] else argv[0]}
    (layout.pids / f"{name}.json").write_text(json.dumps(record))
    return proc.pid


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part] or None


def _is_ours(pid: int, exe: str) -> bool:
    cmdline = _cmdline(pid)
    if cmdline is None:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    except OSError:
        return False
    return cmdline[0] == exe or os.path.realpath(cmdline[0]) == exe or Path(cmdline[0]).name == Path(exe).name


def alive(layout: Layout, name: str) -> bool:
    record = _read(layout.pids / f"{name}.json")
    return record is not None and _is_ours(record["pid"], record["exe"])


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("pid"), int) else None


def signal_pid(pid: int, exe: str, sig: signal.Signals) -> bool:
    if not _is_ours(pid, exe):
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def stop_pid(pid: int, exe: str, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL once `grace` seconds have passed."""
    if not signal_pid(pid, exe, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _is_ours(pid, exe):
            return
        time.sleep(0.05)
    signal_pid(pid, exe, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _is_ours(pid, exe):
        time.sleep(0.05)


def stop(layout: Layout, name: str, grace: float = 10.0) -> None:
    path = layout.pids / f"{name}.json"
    record = _read(path)
    if record is not None:
        stop_pid(record["pid"], record["exe"], grace)
    path.unlink(missing_ok=True)


def stop_all(layout: Layout, order: Sequence[str]) -> None:
    """Stop the named daemons in `order`, then any other pid file left behind."""
    for name in order:
        stop(layout, name)
    if layout.pids.is_dir():
        for path in sorted(layout.pids.glob("*.json")):
            stop(layout, path.stem)

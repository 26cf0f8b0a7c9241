"""`make test`: the whole suite but `gpu` and `soak`, in two phases, with every step's time.

    python -m tests.run [--workers N] [--record PATH] [--since EPOCH] [PYTEST ARGS...]

1. The parallel phase: every test not marked `serial`, on pytest-xdist workers. Tests wait on
   the control plane, on a trainer subprocess or on a build far more than they compute, so more
   workers than cores pay (measured on the 2-core CI machine: tests/timing/). Tests go to
   whichever worker is free (`--dist loadgroup`), except those that share a module- or
   class-scoped fixture (a trained run, a GGUF export): they stay together on one worker
   (tests/conftest.py), so it is built once, as in a serial run.
2. The serial phase: tests marked `serial`, alone on the control plane: they install cluster-wide
   objects, or what they assert depends on timing that neighbours would disturb.

Before them, the builds the suite needs are made where the versioned caches lack them (the
control plane's binaries, Kueue, promtool and MinIO's server; llama.cpp's bindings and tools), the Go build and
the C++ build side by side: no test then waits on a build inside its own time limit. A run
given its own pytest arguments (a subset) skips this; the fixtures build what their tests need.

The control plane starts once for both: this process registers itself beside each test session
(FINETUNE_TEST_HOLDER, tests/fixtures/cluster.py) and leaves at the end, stopping a cluster that
a session started. Set-up steps inside the run (the cluster's binaries and start, llama.cpp's
builds) report their times through tests/support/steps.py; `--since` is when `make` began, so
the time spent before the tests (the venv's install when the pins changed) is printed too.
`--record PATH` writes the steps and the 25 slowest tests as JSON (tests/timing/*.json).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path

from tests.fixtures.cluster import HOLDER_ENV
from tests.support.steps import STEPS_ENV

REPO = Path(__file__).resolve().parents[1]
EXCLUDED = "not gpu and not soak"
PHASES = (("parallel", f"{EXCLUDED} and not serial"), ("serial", f"{EXCLUDED} and serial"))
# Workers per core (TEST_WORKERS=N overrides). Most of a test's time is waiting on the control
# plane, a trainer subprocess or a build, and 2 per core measured fastest (tests/timing/).
WORKERS_PER_CORE = 2
SLOWEST = 25
NO_TESTS = 5  # pytest's exit code when a phase selects nothing (e.g. `-k` matched one phase only)
OUTCOMES = ("passed", "failure", "error", "skipped")
Step = dict[str, object]
Case = tuple[str, float, str]


def _phase_command(name: str, markexpr: str, workers: int, junit: Path, extra: list[str]) -> list[str]:
    command = [sys.executable, "-m", "pytest", "-m", markexpr, f"--junitxml={junit}", f"--durations={SLOWEST}", *extra]
    if name == "parallel" and workers > 1:
        command += ["-n", str(workers), "--dist", "loadgroup"]
    return command


def _cases(junit: Path) -> list[Case]:
    """(test id, seconds, outcome) of every test case a phase ran."""
    if not junit.is_file():
        return []
    cases = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        cases.append((name, float(case.get("time") or 0), outcome))
    return cases


def _leave_cluster() -> None:
    """Stop the cluster (and Kueue) a test session started, now that no phase needs it."""
    from hack.cluster import lifecycle
    from hack.cluster.layout import Layout

    if Layout.for_repo().sessions.is_dir():
        lifecycle.leave_kueue(os.getpid())
        lifecycle.leave_session(os.getpid())


def _steps(path: Path) -> list[Step]:
    """The steps the test sessions reported, one line per kind: each worker joins the cluster
    and may wait on a build another started, so the longest wait is the step's time."""
    if not path.is_file():
        return []
    longest: dict[str, float] = {}
    sessions: dict[str, int] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            step = json.loads(line)
            longest[step["step"]] = max(longest.get(step["step"], 0.0), float(step["seconds"]))
            sessions[step["step"]] = sessions.get(step["step"], 0) + 1
    return [{"step": f"{name} (longest of {sessions[name]})", "seconds": seconds} for name, seconds in longest.items()]


# The builds, in two lanes that run side by side (each lane's commands one after another).
SET_UP = (
    ("the control plane's binaries, Kueue, promtool, MinIO", (("hack.cluster", "binaries"),)),
    (
        "llama.cpp: bindings, then llama-server and llama-quantize",
        (("hack.llama_cpp", "python"), ("hack.llama_cpp", "tools")),
    ),
)


def _set_up() -> list[Step]:
    """Each lane of SET_UP in its own thread; their times. A failed build fails the run."""
    steps: list[Step] = []

    def lane(name: str, commands: tuple[tuple[str, str], ...]) -> None:
        started = time.monotonic()
        for module, command in commands:
            done = subprocess.run(
                [sys.executable, "-m", module, command], cwd=REPO, stdout=subprocess.DEVNULL, check=False
            )
            if done.returncode != 0:
                raise SystemExit(f"tests/run.py: `python -m {module} {command}` failed ({done.returncode})")
        steps.append(
            {"step": f"set-up: {name} (built where not cached)", "seconds": round(time.monotonic() - started, 1)}
        )

    print("== tests/run.py: set-up: building what the caches lack", flush=True)
    with concurrent.futures.ThreadPoolExecutor(len(SET_UP)) as pool:
        for future in [pool.submit(lane, name, commands) for name, commands in SET_UP]:
            future.result()
    return steps


def _run_phases(workers: int, work: Path, extra: list[str]) -> tuple[dict[str, int], list[Step], list[Case]]:
    env = {**os.environ, HOLDER_ENV: str(os.getpid()), STEPS_ENV: str(work / "steps.jsonl")}
    codes: dict[str, int] = {}
    steps: list[Step] = []
    cases: list[Case] = []
    try:
        for name, markexpr in PHASES:
            junit = work / f"{name}.xml"
            command = _phase_command(name, markexpr, workers, junit, extra)
            print(f"\n== tests/run.py: {name} phase: {' '.join(command[1:])}", flush=True)
            started = time.monotonic()
            codes[name] = subprocess.run(command, cwd=REPO, env=env, check=False).returncode
            used = workers if name == "parallel" else 1
            steps.append({"step": f"{name} phase ({used} workers)", "seconds": round(time.monotonic() - started, 1)})
            cases += _cases(junit)
    finally:
        _leave_cluster()
    return codes, steps, cases


def _report(steps: list[Step], cases: list[Case], total: float) -> dict[str, int]:
    print("\n== tests/run.py: steps")
    for step in steps:
        print(f"  {step['seconds']:>8.1f} s  {step['step']}")
    print(f"  {total:>8.1f} s  in all")
    outcomes = {kind: sum(1 for case in cases if case[2] == kind) for kind in OUTCOMES}
    print(f"  tests: {len(cases)} run: " + ", ".join(f"{count} {kind}" for kind, count in outcomes.items()))
    return outcomes


def _commit() -> str:
    command = ["git", "rev-parse", "--short", "HEAD"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def _record(path: Path, workers: int, steps: list[Step], cases: list[Case], total: float) -> None:
    slowest = sorted(cases, key=lambda case: case[1], reverse=True)[:SLOWEST]
    record = {
        "recorded": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": _commit(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "workers": workers,
        "steps": steps,
        "total_seconds": total,
        "tests": {"run": len(cases), **{kind: sum(1 for c in cases if c[2] == kind) for kind in OUTCOMES}},
        "slowest": [{"test": test, "seconds": round(seconds, 1)} for test, seconds, _ in slowest],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(f"  record: {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.run", description=(__doc__ or "").split("\n\n")[0])
    default_workers = int(os.environ.get("TEST_WORKERS", WORKERS_PER_CORE * (os.cpu_count() or 1)))
    parser.add_argument("--workers", type=int, default=default_workers)
    parser.add_argument(
        "--record",
        type=Path,
        default=os.environ.get("TEST_RECORD") or None,
        help="write the steps and slowest tests as JSON here (default: $TEST_RECORD)",
    )
    parser.add_argument("--since", type=float, help="when `make` began (epoch seconds)")
    args, extra = parser.parse_known_args(argv)

    began = time.time()
    before: list[Step] = []
    if args.since:
        waited = round(began - args.since, 1)
        before.append({"step": "before the tests (the venv's install when the pins changed)", "seconds": waited})
    built = [] if extra else _set_up()
    work = Path(tempfile.mkdtemp(prefix="finetune-tests-"))
    codes, phases, cases = _run_phases(args.workers, work, extra)
    steps = [*before, *built, *_steps(work / "steps.jsonl"), *phases]
    total = round(time.time() - (args.since or began), 1)
    _report(steps, cases, total)
    if args.record:
        _record(args.record, args.workers, steps, cases, total)
    failed = {name: code for name, code in codes.items() if code not in (0, NO_TESTS)}
    if failed or all(code == NO_TESTS for code in codes.values()):
        print(f"tests/run.py: failed phases: {failed or codes}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

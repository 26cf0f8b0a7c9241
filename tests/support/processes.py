"""The node agent's trainer processes, found from the test's side: the launcher a pod runs (by
its pid file in the pod's folder) and the worker of one rank it started (by parent and RANK)."""

import json
from pathlib import Path
from typing import Any

from tests.support.harness import wait_for


def trainer_pid(cluster: Any, namespace: str, pod_name: str) -> int:
    folders = list(Path(cluster.layout.pods).glob(f"{namespace}_{pod_name}_*"))
    record = wait_for(
        lambda: next((f / "trainer.pid.json" for f in folders if (f / "trainer.pid.json").exists()), None),
        30,
        "the trainer's pid file",
    )
    return int(json.loads(record.read_text())["pid"])


def worker_pid(launcher: int, rank: int) -> int | None:
    """The pid of the trainer process of `rank` that the pod's launcher started."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            # The launcher starts each worker in a session of its own: find them by parent.
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent != launcher:
                continue
            command = (proc / "cmdline").read_bytes().split(b"\0")
            environment = (proc / "environ").read_bytes().split(b"\0")
        except (OSError, ProcessLookupError):
            continue
        if b"--worker" in command and f"RANK={rank}".encode() in environment:
            return int(proc.name)
    return None

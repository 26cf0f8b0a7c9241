"""Run the real promtool against rule files: `check rules` and `test rules`.

promtool comes from the same versioned binary cache as the control plane (`hack.cluster.binaries`),
built once from the Go module proxy the first time a test needs it; `PROMTOOL` names another.
"""

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml


def promtool_binary() -> Path:
    if configured := os.environ.get("PROMTOOL"):
        return Path(configured)
    from hack.cluster import binaries
    from hack.cluster.layout import Layout

    return binaries.ensure_component(Layout.for_repo(), binaries.PROMTOOL) / "promtool"


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool_binary()), *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False
    )


def write_rule_file(path: Path, groups: list[dict[str, Any]]) -> Path:
    """A Prometheus rule file (what a PrometheusRule's spec holds), for promtool."""
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path

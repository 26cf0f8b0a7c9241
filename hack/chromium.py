"""Debian's Chromium, for the tests that open report.html in a real browser (headless).

Installed from Debian's package archive with apt-get when /usr/bin/chromium is missing (the test
machines run as root and reach the archive), under a lock: two test workers starting at once
install it once. Nothing else of the machine is touched.

    python -m hack.chromium        # install it where missing; prints its path
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .cache import binary_cache_root, cache_lock

CHROMIUM = Path("/usr/bin/chromium")
PACKAGE = "chromium"
# Off: everything a headless run for a screenshot does not need, and every reach for the network.
HEADLESS_FLAGS = (
    "--headless",
    "--no-sandbox",  # root in a container: Chromium's sandbox needs user namespaces it may not have
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(["apt-get", *args], capture_output=True, text=True, env=env, check=False)


def install() -> Path:
    """Chromium's path, installing the package first where it is missing."""
    if CHROMIUM.is_file():
        return CHROMIUM
    if shutil.which("apt-get") is None:
        raise SystemExit(f"{CHROMIUM} is missing and this machine has no apt-get: install Chromium")
    with cache_lock(binary_cache_root() / "chromium"):
        if CHROMIUM.is_file():  # another process installed it while this one waited
            return CHROMIUM
        result = _apt("install", "-y", "--no-install-recommends", PACKAGE)
        if result.returncode != 0:  # a fresh machine's package lists may be empty or stale
            _apt("update")
            result = _apt("install", "-y", "--no-install-recommends", PACKAGE)
        if result.returncode != 0 or not CHROMIUM.is_file():
            tail = " ".join(result.stderr.split()[-40:])
            raise SystemExit(f"apt-get install {PACKAGE} failed (exit {result.returncode}): {tail}")
    return CHROMIUM


if __name__ == "__main__":
    print(install())
    sys.exit(0)

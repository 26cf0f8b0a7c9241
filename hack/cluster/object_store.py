"""MinIO's server: the S3-compatible store the object-storage tests read from and write to.

Built like the control plane's binaries (binaries.MINIO, once per version, into the shared cache),
started as a local process on 127.0.0.1 only (its console off), its data in a folder the caller
gives, and stopped by the caller. A real server, not a mock: the tests see S3's listing, ranged
GETs, ETags, multipart uploads and refusals as a store answers them.
"""

import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from . import binaries
from .layout import Layout

READY_TIMEOUT_S = 60


@dataclass(frozen=True)
class ObjectStore:
    endpoint: str
    access_key: str
    secret_key: str
    process: "subprocess.Popen[bytes]"
    log: Path

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers: the process and nothing else."""
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def _ready(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/minio/health/ready", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def start(folder: Path, port: int, access_key: str, secret_key: str) -> ObjectStore:
    """A MinIO server on 127.0.0.1:`port` keeping its data in `folder`, ready to answer."""
    binary = binaries.ensure_component(Layout.for_repo(), binaries.MINIO) / "minio"
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    log = folder / "minio.log"
    env = {
        **os.environ,
        "MINIO_ROOT_USER": access_key,
        "MINIO_ROOT_PASSWORD": secret_key,
        "MINIO_BROWSER": "off",
        "MINIO_UPDATE": "off",
    }
    with log.open("ab") as out:
        process = subprocess.Popen(
            [str(binary), "server", "--quiet", "--address", f"127.0.0.1:{port}", str(data)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    endpoint = f"http://127.0.0.1:{port}"
    store = ObjectStore(endpoint, access_key, secret_key, process, log)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not _ready(endpoint):
        if process.poll() is not None or time.monotonic() > deadline:
            store.stop()
            raise SystemExit(f"object store: MinIO did not start on {endpoint}: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    return store

"""`ftjob eval --tasks pvc:CLAIM/PATH`: a task folder on a claim, copied into a local temporary
folder through the upload pod's read-only routes (`GET /list`, `GET /read`, through the API server's
pod proxy, as `ftjob report` reads a job's files) and then read as a local folder is. Refusals name
the file as `pvc:CLAIM/PATH/...`, not the temporary copy."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final

from . import kube
from .errors import CliError
from .eval_tasks import TaskFile, checked
from .job_output import ClaimReader, claim_reader

PREFIX: Final = "pvc:"
# A task folder is YAMLs and small data files; more than this is a folder named by mistake.
MAX_FILES: Final = 1000
MAX_BYTES: Final = 256 << 20


@dataclass(frozen=True)
class ClaimFolder:
    claim: str
    path: str  # inside the claim, no leading '/'; '' for its root

    @property
    def shown(self) -> str:
        return f"{PREFIX}{self.claim}/{self.path}".rstrip("/")


def claim_folder(value: str) -> ClaimFolder | None:
    """`pvc:CLAIM/PATH` parsed; None for a local folder."""
    if not value.startswith(PREFIX):
        return None
    claim, _, path = value.removeprefix(PREFIX).partition("/")
    parts = PurePosixPath(path).parts
    if not claim or ".." in parts or path.startswith("/"):
        raise CliError(f"--tasks {value}: expected pvc:CLAIM/PATH, a folder inside the claim")
    return ClaimFolder(claim, "/".join(parts))


def _entries(reader: ClaimReader, folder: ClaimFolder, path: str) -> list[tuple[str, int | None]]:
    reply = reader.proxy.call("GET", "list", {"path": path})
    if reply.status == 404:
        raise CliError(f"--tasks {folder.shown}: claim {folder.claim} has no folder {path or '/'}")
    if reply.status != 200:
        raise CliError(f"--tasks {folder.shown}: listing {path or '/'}: {reply.error}")
    return [(str(e["name"]), e.get("size")) for e in reply.body.get("entries") or []]


def copy_folder(reader: ClaimReader, folder: ClaimFolder, into: Path) -> None:
    """Every file under the claim's folder into `into` (hidden names and __pycache__ left out)."""
    pending, files, total = [folder.path], 0, 0
    while pending:
        current = pending.pop()
        for name, size in _entries(reader, folder, current):
            if name.startswith(".") or name == "__pycache__":
                continue
            remote = f"{current}/{name}" if current else name
            if size is None:  # a folder (or a link out of the claim, which the listing below refuses)
                pending.append(remote)
                continue
            files, total = files + 1, total + int(size)
            if files > MAX_FILES or total > MAX_BYTES:
                raise CliError(f"--tasks {folder.shown}: more than {MAX_FILES} files or {MAX_BYTES >> 20} MiB")
            data = reader.read(remote)
            if data is None:
                raise CliError(f"--tasks {folder.shown}: {remote} went while it was read")
            local = into / (remote.removeprefix(folder.path + "/") if folder.path else remote)
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(data)


@contextmanager
def claim_tasks(cluster: kube.Cluster, folder: ClaimFolder, args: argparse.Namespace) -> Iterator[list[TaskFile]]:
    """The claim folder's tasks, checked as a local folder's are, while the copy lasts."""
    with tempfile.TemporaryDirectory(prefix="ftjob-eval-") as temporary:
        copy = Path(temporary) / "tasks"
        copy.mkdir()
        with claim_reader(cluster, folder.claim, args) as reader:
            copy_folder(reader, folder, copy)
        try:
            tasks = checked(copy)
        except CliError as exc:
            raise CliError(str(exc).replace(str(copy), folder.shown), exc.exit_code) from None
        yield tasks

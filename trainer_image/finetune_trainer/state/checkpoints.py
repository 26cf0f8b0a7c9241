"""Checkpoints that are either complete or absent, and resume from the newest complete one.

Hugging Face's `get_last_checkpoint` picks the highest-numbered `checkpoint-N` without checking
that it is whole, and its own atomic-save attempts were reverted; a pod killed mid-save then
resumes from a torn folder. Here a checkpoint is written into a staging folder, fsynced, given
a completion marker that lists every file with its size, and only then renamed into place.
Anything without a valid marker is ignored on start and removed.

Saving a step that already has a checkpoint (after a resume) never leaves that name without a
complete checkpoint: the two folders are swapped in one step (Linux `renameat2` with
`RENAME_EXCHANGE`), and the old one is removed from the staging folder afterwards. Where the
filesystem cannot swap (NFS), the marked staging copy is the journal: the old folder is removed
(marker first) and the new one renamed into place, and a start that finds a marked staging
copy beside a `checkpoint-N` that is not whole finishes the move. Either way a kill between any
two filesystem operations leaves a complete checkpoint of that step.

`checkpoint-N` holds the state after N optimizer steps. A run stopped by SIGTERM between the
micro-batches of step N+1 writes `checkpoint-N-micro-M` (M of them done, their summed gradients
kept): a name of its own, so it never replaces the step checkpoint it follows, and it sorts
after it.
"""

import ctypes
import errno
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_api.contract import now

log = logging.getLogger(__name__)

PREFIX = "checkpoint-"
STAGING_PREFIX = ".staging-"
MARKER = "CHECKPOINT_COMPLETE.json"
MICRO_INFIX = "-micro-"
_NAME = re.compile(r"^checkpoint-(\d+)(?:-micro-(\d+))?$")


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    time: str
    micro: int = 0  # micro-batches of step `step + 1` done (a checkpoint written on SIGTERM)

    @property
    def name(self) -> str:
        return self.path.name


def checkpoint_name(step: int, micro: int = 0) -> str:
    return f"{PREFIX}{step}{MICRO_INFIX}{micro}" if micro else f"{PREFIX}{step}"


def _parse(name: str) -> tuple[int, int] | None:
    match = _NAME.match(name)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2) or 0)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> dict[str, int]:
    """fsync every file and folder under root; return {relative path: size} for the marker."""
    sizes: dict[str, int] = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            _fsync_path(path)
            sizes[str(path.relative_to(root))] = path.stat().st_size
        _fsync_path(Path(folder))
    return sizes


# renameat2(2): relative paths from the working directory, and the flag that swaps two names.
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# What a filesystem or kernel that cannot swap answers: fall back to the journal.
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}


def exchange_folders(a: Path, b: Path) -> bool:
    """Swap two folders' names in one step; False where libc, kernel or filesystem cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _NO_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _is_whole(folder: Path, step: int, micro: int) -> tuple[bool, str]:
    marker = _read_marker(folder)
    if marker is None:
        return False, "no completion marker"
    if marker.get("step") != step or marker.get("micro", 0) != micro:
        named = f"step {marker.get('step')}" + (f", micro-batch {marker['micro']}" if marker.get("micro") else "")
        return False, f"marker names {named}"
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        return False, "marker lists no files"
    for name, size in files.items():
        path = folder / name
        if not path.is_file():
            return False, f"{name} is missing"
        if path.stat().st_size != size:
            return False, f"{name} is {path.stat().st_size} bytes, marker says {size}"
    return True, ""


class CheckpointStore:
    """The `<output>/checkpoints` folder: staging, commit, listing, retention, cleaning."""

    def __init__(self, root: Path, keep: int, exchange: Callable[[Path, Path], bool] = exchange_folders) -> None:
        self.root = root
        self.keep = keep
        # How a same-step save swaps folders; returning False means this filesystem cannot.
        self.exchange = exchange

    def complete(self) -> list[Checkpoint]:
        found: list[Checkpoint] = []
        if not self.root.is_dir():
            return found
        for entry in self.root.iterdir():
            parsed = _parse(entry.name)
            if parsed is None or not entry.is_dir():
                continue
            whole, _ = _is_whole(entry, *parsed)
            if whole:
                marker = _read_marker(entry) or {}
                found.append(Checkpoint(parsed[0], entry, str(marker.get("time", "")), parsed[1]))
        return sorted(found, key=lambda c: (c.step, c.micro))

    def latest(self) -> Checkpoint | None:
        done = self.complete()
        return done[-1] if done else None

    def clean_incomplete(self) -> list[str]:
        """Remove staging folders and checkpoint folders that are not whole; return what and why."""
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        # Staging folders sort first: a move they finish makes their checkpoint whole below.
        for entry in sorted(self.root.iterdir()):
            parsed = _parse(entry.name)
            if entry.name.startswith(STAGING_PREFIX):
                if self._finish_move(entry):
                    removed.append(f"{entry.name} (moved into place)")
                    continue
                why = "unfinished write"
            elif parsed and entry.is_dir():
                whole, why = _is_whole(entry, *parsed)
                if whole:
                    continue
            else:
                continue
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(f"{entry.name} ({why})")
        return removed

    def begin(self, step: int, micro: int = 0) -> Path:
        """A fresh staging folder; the trainer writes `checkpoint_name(step, micro)` inside it."""
        staging = self._staging(step, micro)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        return staging

    def commit(self, step: int, micro: int = 0) -> Checkpoint:
        name = checkpoint_name(step, micro)
        staging = self._staging(step, micro)
        written = staging / name
        sizes = _fsync_tree(written)
        stamp = now()
        marker = written / MARKER
        record = {"step": step, "micro": micro, "time": stamp, "files": sizes}
        marker.write_text(json.dumps(record, indent=1), encoding="utf-8")
        _fsync_path(marker)
        _fsync_path(written)
        final = self.root / name
        # Same step saved again after a resume: swapped in whole; else the journal's move.
        if not (final.exists() and self.exchange(written, final)):
            self._move_into_place(written, final)
        _fsync_path(self.root)
        shutil.rmtree(staging, ignore_errors=True)
        self.rotate()
        return Checkpoint(step, final, stamp, micro)

    def _move_into_place(self, written: Path, final: Path) -> None:
        # The marked copy in staging stands for the step while the old folder goes.
        if final.exists():
            self._remove(final)
        written.rename(final)

    def _finish_move(self, staging: Path) -> bool:
        """A staging folder whose checkpoint is marked whole, where the checkpoint of its name is
        not: a move killed halfway (the journal), finished now. False: nothing to finish."""
        name = PREFIX + staging.name.removeprefix(STAGING_PREFIX)
        parsed, written, final = _parse(name), staging / name, self.root / name
        if parsed is None or not _is_whole(written, *parsed)[0] or _is_whole(final, *parsed)[0]:
            return False
        self._move_into_place(written, final)
        _fsync_path(self.root)
        shutil.rmtree(staging, ignore_errors=True)
        return True

    def _staging(self, step: int, micro: int) -> Path:
        return self.root / f"{STAGING_PREFIX}{checkpoint_name(step, micro).removeprefix(PREFIX)}"

    def rotate(self) -> list[Path]:
        done = self.complete()
        old = done[: max(0, len(done) - self.keep)]
        for checkpoint in old:
            self._remove(checkpoint.path)
        return [c.path for c in old]

    @staticmethod
    def _remove(folder: Path) -> None:
        # Marker first: a crash in the middle of rmtree leaves an unmarked folder, which the
        # next start removes, never a marked folder with files missing.
        (folder / MARKER).unlink(missing_ok=True)
        _fsync_path(folder)
        shutil.rmtree(folder, ignore_errors=True)

"""The object cache claim's layout: each source's copy, its manifest, its partial files, its lock.

    <root>/<store>/<bucket>/<key>             the copy, as in the bucket (contract.object_copy_path)
    <root>/.finetune/manifests/<id>.json      per source: the key, size and ETag of each object copied
    <root>/.finetune/partial/<id>/<relative>  an object being fetched, and <relative>.json its ETag
    <root>/.finetune/locks/<id>.lock          one fetch of a source at a time (jobs share the claim)

An object moves into the copy only whole and verified (a rename), and the manifest names it only
after that: a copy whose every object the manifest names with the listing's ETag is reused as
it is. A partial file of the same ETag is continued where it stopped.
"""

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from finetune_api.contract import object_copy_path
from finetune_api.object_storage import S3Source

from .listing import Listing, StoredObject

HIDDEN: Final = ".finetune"


@dataclass(frozen=True)
class Copy:
    """One source's copy on the cache claim mounted at `root`."""

    root: Path
    source: S3Source

    @property
    def ident(self) -> str:
        return hashlib.sha256(object_copy_path(self.source).encode()).hexdigest()[:24]

    @property
    def path(self) -> Path:
        """The copy: a prefix's folder, or the one object's file."""
        return self.root / object_copy_path(self.source)

    @property
    def folder(self) -> Path:
        return self.path if self.source.is_prefix else self.path.parent

    def target(self, obj: StoredObject) -> Path:
        return self.folder / obj.relative

    def partial(self, obj: StoredObject) -> Path:
        return self.root / HIDDEN / "partial" / self.ident / obj.relative

    @property
    def manifest_path(self) -> Path:
        return self.root / HIDDEN / "manifests" / f"{self.ident}.json"

    def manifest(self) -> dict[str, dict[str, Any]]:
        """{relative: {key, size, etag}} of the objects copied whole; {} when none is."""
        try:
            data = json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        objects = data.get("objects") if isinstance(data, dict) else None
        return objects if isinstance(objects, dict) else {}

    def record(self, objects: dict[str, dict[str, Any]]) -> None:
        """Write the manifest whole (a rename), so a reader never sees half of one."""
        self.manifest_path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.manifest_path.with_suffix(f".{os.getpid()}.tmp")
        body = {"uri": self.source.uri, "objects": objects}
        temporary.write_text(json.dumps(body, indent=1, sort_keys=True), encoding="utf-8")
        temporary.replace(self.manifest_path)

    def held(self, obj: StoredObject, manifest: dict[str, dict[str, Any]]) -> bool:
        """Whether the copy holds `obj` as listed: named by the manifest with its ETag and size,
        and its file there with that size."""
        entry = manifest.get(obj.relative) or {}
        if entry.get("etag") != obj.etag or entry.get("size") != obj.size:
            return False
        target = self.target(obj)
        return target.is_file() and target.stat().st_size == obj.size

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One fetch of this source at a time: a second job waits and then finds the copy made."""
        lock = self.root / HIDDEN / "locks" / f"{self.ident}.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        with lock.open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield


def copy_etags(root: Path, source: S3Source) -> Listing | None:
    """What the manifest of `source`'s copy on the claim mounted at `root` says of its objects, as
    a Listing (the fingerprint's view of them); None when there is no manifest."""
    manifest = Copy(root, source).manifest()
    if not manifest:
        return None
    objects = tuple(
        StoredObject(str(e.get("key")), rel, int(e.get("size") or 0), str(e.get("etag"))) for rel, e in manifest.items()
    )
    return Listing(source.uri, objects)


def used_bytes(root: Path) -> int:
    """Bytes of every file on the claim (the copies of every source, partial files included)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(folder) / name).stat().st_size
    return total


def free_bytes(root: Path, capacity: int | None) -> int:
    """Room left on the claim: the file system's, and the claim's size less what its files take
    (a claim of a shared file system shows that file system's room, not its own)."""
    stat = os.statvfs(root)
    room = stat.f_bavail * stat.f_frsize
    return room if capacity is None else min(room, capacity - used_bytes(root))

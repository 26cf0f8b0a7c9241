"""An object's bytes against its ETag: the MD5 of its bytes, or for a multipart upload the MD5 of
its parts' MD5s with the part count, as S3 and the compatible stores make it.

A multipart ETag needs the part size, which the store says of part 1 (a HEAD with PartNumber);
an ETag that is neither kind (an object encrypted with a KMS key) leaves the size as the check.
"""

import hashlib
import re
from pathlib import Path
from typing import Any, Final

PIECE: Final = 8 << 20
MD5_ETAG: Final = re.compile(r"^[0-9a-f]{32}$")
MULTIPART_ETAG: Final = re.compile(r"^([0-9a-f]{32})-([0-9]+)$")


def _md5(path: Path, start: int, length: int) -> "hashlib._Hash":
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as handle:
        handle.seek(start)
        left = length
        while left > 0:
            chunk = handle.read(min(PIECE, left))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    return digest


def file_etag(path: Path, parts: int, part_size: int) -> str:
    """The ETag S3 gives these bytes uploaded in `parts` parts of `part_size` (1: a plain MD5)."""
    size = path.stat().st_size
    if parts <= 1:
        return _md5(path, 0, size).hexdigest()
    digest = hashlib.md5(usedforsecurity=False)
    for number in range(parts):
        digest.update(_md5(path, number * part_size, part_size).digest())
    return f"{digest.hexdigest()}-{parts}"


def verify(store: Any, bucket: str, key: str, *, etag: str, path: Path, size: int) -> str | None:
    """None when the file holds the object's bytes (its size, and its ETag where the ETag is an
    MD5 kind); else what differs."""
    found = path.stat().st_size
    if found != size:
        return f"{found} bytes, the object has {size}"
    if MD5_ETAG.match(etag):
        computed = file_etag(path, 1, size)
    elif multipart := MULTIPART_ETAG.match(etag):
        head = store.head_object(Bucket=bucket, Key=key, PartNumber=1)
        computed = file_etag(path, int(multipart.group(2)), int(head["ContentLength"]))
    else:
        return None
    return None if computed == etag else f"ETag {computed} of the bytes fetched, the object's is {etag}"

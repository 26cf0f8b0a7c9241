"""What a source holds: its objects' keys, sizes and ETags, read with one listing (a prefix) or
one HEAD (an object), and nothing downloaded. The pre-flight says the bytes to fetch from it;
the fetch compares it with the copy on the claim."""

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from finetune_api.object_storage import S3Source
from finetune_api.reasons import ExitReason

from ..failures import TrainerFailure
from .store import Where, refusal


@dataclass(frozen=True)
class StoredObject:
    key: str
    relative: str  # its path under the copy (a prefix's objects), or its name (one object)
    size: int
    etag: str


@dataclass(frozen=True)
class Listing:
    uri: str
    objects: tuple[StoredObject, ...]

    @property
    def size(self) -> int:
        return sum(o.size for o in self.objects)

    def identity(self) -> str:
        """The objects' keys and ETags, hashed: what the fingerprint records of them."""
        digest = hashlib.sha256()
        for o in sorted(self.objects, key=lambda o: o.key):
            digest.update(f"{o.key}\0{o.etag}\0{o.size}\n".encode())
        return f"{len(self.objects)} objects, {self.size} bytes, sha256 of keys and ETags {digest.hexdigest()[:16]}"


def _etag(value: object) -> str:
    return str(value or "").strip('"')


def _usable(relative: str) -> bool:
    """A key the copy can mirror as a file: folder markers ("x/") and "."/".." segments are not."""
    parts = relative.split("/")
    return bool(relative) and not relative.endswith("/") and all(p not in ("", ".", "..") for p in parts)


def _prefix(store: Any, source: S3Source) -> list[StoredObject]:
    found: list[StoredObject] = []
    pages = store.get_paginator("list_objects_v2").paginate(Bucket=source.bucket, Prefix=source.key)
    for page in pages:
        for item in page.get("Contents") or []:
            relative = str(item["Key"])[len(source.key) :]
            if _usable(relative):
                found.append(StoredObject(str(item["Key"]), relative, int(item["Size"]), _etag(item.get("ETag"))))
    return found


def list_source(store: Any, where: Where) -> Listing:
    """The source's objects; TrainerFailure naming the field when the store refuses, the bucket or
    the key is missing, or a prefix holds nothing."""
    source = where.source
    assert isinstance(source, S3Source)
    try:
        # One listing first: it tells a missing bucket (NoSuchBucket) and refused credentials
        # (InvalidAccessKeyId, SignatureDoesNotMatch) by their codes, which a HEAD cannot.
        store.list_objects_v2(Bucket=source.bucket, Prefix=source.key, MaxKeys=1)
        if source.is_prefix:
            objects = _prefix(store, source)
        else:
            head = store.head_object(Bucket=source.bucket, Key=source.key)
            name = source.key.rsplit("/", 1)[-1]
            objects = [StoredObject(source.key, name, int(head["ContentLength"]), _etag(head.get("ETag")))]
    except (BotoCoreError, ClientError) as exc:
        raise refusal(where, exc) from None
    if not objects:
        raise TrainerFailure(
            ExitReason.InvalidConfig,
            f"{where.at('key')}: no objects under prefix {source.key!r} in bucket {source.bucket!r}",
        )
    return Listing(source.uri, tuple(sorted(objects, key=lambda o: o.relative)))


def total(listings: Sequence[Listing]) -> int:
    return sum(listing.size for listing in listings)

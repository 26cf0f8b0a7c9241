"""A source's objects onto the object cache claim: reused where the copy's ETags match the
store's, else fetched (several objects at once, each resumable), verified, recorded.

What it did is said on the log and returned (`Fetched`), for the fetch Job's termination
message and so the job's status: "reused" when nothing came over the network.
"""

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from finetune_api.object_storage import S3Source
from finetune_api.quantities import describe_bytes
from finetune_api.reasons import ExitReason

from ..failures import TrainerFailure
from .copies import Copy, free_bytes
from .listing import Listing, StoredObject
from .store import Where, client
from .transfer import fetch_object

log = logging.getLogger(__name__)

# Objects fetched at once (a model's shards): several streams fill a link one stream does not.
PARALLEL: Final = 4


@dataclass(frozen=True)
class Fetched:
    role: str
    uri: str
    objects: int
    size: int
    fetched: int  # bytes that came over the network in this run
    resumed: int  # objects continued from a partial file
    path: str  # the copy on the claim

    @property
    def reused(self) -> bool:
        return self.fetched == 0 and self.resumed == 0

    def line(self, claim: str) -> str:
        what = f"{self.uri} ({self.objects} object{'s' if self.objects != 1 else ''}, {describe_bytes(self.size)})"
        if self.reused:
            return f"{self.role}: reused the copy of {what} on claim {claim!r}: its ETags match, nothing fetched"
        resumed = f", {self.resumed} resumed" if self.resumed else ""
        return f"{self.role}: fetched {describe_bytes(self.fetched)} of {what} into claim {claim!r}{resumed}"

    def to_dict(self, claim: str) -> dict[str, Any]:
        return {
            "source": self.role,
            "uri": self.uri,
            "objects": self.objects,
            "bytes": self.size,
            "fetchedBytes": self.fetched,
            "reused": self.reused,
            "claimName": claim,
            "message": self.line(claim),
        }


def _room(copy: Copy, where: Where, wanted: list[StoredObject], capacity: int | None, claim: str) -> None:
    """Refuse, in one line, objects the claim cannot hold beside what it holds already."""
    needed = 0
    for obj in wanted:
        partial = copy.partial(obj)
        needed += obj.size - (partial.stat().st_size if partial.is_file() else 0)
    room = free_bytes(copy.root, capacity)
    if needed > room:
        raise TrainerFailure(
            ExitReason.InvalidConfig,
            f"{where.field}: the objects to fetch ({describe_bytes(needed)}) do not fit in the object cache claim "
            f"{claim!r} ({describe_bytes(max(room, 0))} free): name a larger claim in spec.objectCache.claimName",
        )


def _prune(copy: Copy, listing: Listing, manifest: dict[str, dict[str, Any]]) -> None:
    """Files an earlier copy of this source had that the store no longer lists (a shard removed)."""
    listed = {o.relative for o in listing.objects}
    for relative in set(manifest) - listed:
        (copy.folder / relative).unlink(missing_ok=True)
        manifest.pop(relative, None)


def fetch_source(role: str, where: Where, listing: Listing, root: Path, *, capacity: int | None, claim: str) -> Fetched:
    """The copy of `where`'s source on the claim mounted at `root`, made or reused."""
    source = where.source
    assert isinstance(source, S3Source)
    copy = Copy(root, source)
    with copy.locked():
        manifest = copy.manifest()
        wanted = [o for o in listing.objects if not copy.held(o, manifest)]
        _prune(copy, listing, manifest)
        done = Fetched(role, listing.uri, len(listing.objects), listing.size, 0, 0, str(copy.path))
        if not wanted:
            log.info("%s", done.line(claim))
            return done
        _room(copy, where, wanted, capacity, claim)
        store = client(where, pool=PARALLEL * 2)
        lock = threading.Lock()
        moved: list[tuple[int, int]] = []

        def one(obj: StoredObject) -> None:
            got = fetch_object(
                store, where, obj, partial=copy.partial(obj), target=copy.target(obj), progress=lambda _: None
            )
            with lock:
                manifest[obj.relative] = {"key": obj.key, "size": obj.size, "etag": obj.etag}
                copy.record(manifest)
                moved.append((got.fetched, 1 if got.resumed_at else 0))
            log.info("%s: %s (%s) verified", role, obj.key, describe_bytes(obj.size))

        log.info("%s: fetching %d of %d objects of %s", role, len(wanted), len(listing.objects), listing.uri)
        with ThreadPoolExecutor(min(PARALLEL, len(wanted))) as pool:
            for future in [pool.submit(one, obj) for obj in wanted]:
                future.result()
        copy.record(manifest)
    fetched = Fetched(
        role,
        listing.uri,
        len(listing.objects),
        listing.size,
        sum(m[0] for m in moved),
        sum(m[1] for m in moved),
        str(copy.path),
    )
    log.info("%s", fetched.line(claim))
    return fetched

"""One object from the store to the claim, in ranged GETs appended to a partial file that a later
run continues where it stopped, then checked against its ETag and renamed into the copy.

A partial file is continued only under the ETag it was begun with (its `.json` beside it), and
each range is asked for with If-Match on that ETag: an object replaced in the store half-way is
never stitched from two versions.
"""

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError

from finetune_api.reasons import ExitReason

from .. import faults
from ..failures import TrainerFailure
from .checksums import verify
from .listing import StoredObject
from .store import Where, code_of, refusal

log = logging.getLogger(__name__)

# Bytes per ranged GET: large enough that a request's overhead is nothing, small enough that a
# cut fetch loses little (the partial file keeps every range that arrived).
CHUNK: Final = 64 << 20
PIECE: Final = 1 << 20


@dataclass(frozen=True)
class Moved:
    fetched: int  # bytes that came over the network this run
    resumed_at: int  # bytes of a partial file continued (0: begun afresh)


def _resume_point(partial: Path, obj: StoredObject) -> int:
    state = partial.with_name(partial.name + ".json")
    try:
        begun = json.loads(state.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        begun = None
    if partial.is_file() and isinstance(begun, dict) and begun.get("etag") == obj.etag:
        size = partial.stat().st_size
        if size <= obj.size:
            return size
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(b"")
    state.write_text(json.dumps({"etag": obj.etag, "size": obj.size}), encoding="utf-8")
    return 0


def _range(store: Any, where: Where, obj: StoredObject, span: tuple[int, int], out: Any) -> int:
    start, end = span
    try:
        answer = store.get_object(
            Bucket=where.source.bucket, Key=obj.key, Range=f"bytes={start}-{end}", IfMatch=f'"{obj.etag}"'
        )
    except ClientError as exc:
        if code_of(exc) in ("PreconditionFailed", "412"):
            raise TrainerFailure(
                ExitReason.InvalidData,
                f"{where.at('key')}: {obj.key} changed in the store while it was fetched; run the job again",
            ) from None
        raise refusal(where, exc, obj.key) from None
    except BotoCoreError as exc:
        raise refusal(where, exc, obj.key) from None
    written = 0
    for piece in answer["Body"].iter_chunks(PIECE):
        out.write(piece)
        written += len(piece)
    return written


def fetch_object(
    store: Any, where: Where, obj: StoredObject, *, partial: Path, target: Path, progress: Callable[[int], None]
) -> Moved:
    """Fetch `obj` into `target` (through `partial`); TrainerFailure when its bytes do not match."""
    start = _resume_point(partial, obj)
    if start:
        log.info("resuming %s at %d of %d bytes", obj.key, start, obj.size)
    hooks = faults.current()
    chunk = hooks.fetch_chunk(CHUNK)
    offset = start
    with partial.open("ab") as out:
        while offset < obj.size:
            end = min(offset + chunk, obj.size) - 1
            got = _range(store, where, obj, (offset, end), out)
            out.flush()
            offset += got
            progress(got)
            if got == 0:
                break
            hooks.after_fetch_range()
    wrong = verify(store, where.source.bucket, obj.key, etag=obj.etag, path=partial, size=obj.size)
    if wrong is not None:
        partial.unlink(missing_ok=True)  # a wrong partial is begun afresh next time, not continued
        raise TrainerFailure(ExitReason.InvalidData, f"{where.at('key')}: {obj.key}: fetched {wrong}")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial.replace(target)
    partial.with_name(partial.name + ".json").unlink(missing_ok=True)
    return Moved(fetched=obj.size - start, resumed_at=start)

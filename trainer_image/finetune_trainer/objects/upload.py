"""A finished job's outputs to `output.s3`: every file of the output folder but its checkpoints,
earlier runs' folders and hidden files, under the prefix by its path, then each object's size and
ETag checked against the file (boto3's multipart upload with its retries; the ETag computed with
the same part size).

Run by the trainer after training ended well, so a job is Succeeded only with its copy in the
bucket; a copy refused (credentials, bucket, endpoint) fails the job in one line naming the field,
its outputs still on the claim.
"""

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError

from finetune_api.object_storage import OutputS3
from finetune_api.quantities import describe_bytes
from finetune_api.reasons import ExitReason

from ..failures import TrainerFailure
from .checksums import file_etag
from .store import Where, client, refusal

log = logging.getLogger(__name__)

PART: Final = 64 << 20
# What stays on the claim only: the checkpoints (resume state, large), earlier runs' outputs
# moved aside (onExisting: fresh), the Hub's download cache.
LEFT_OUT: Final = ("checkpoints", "previous-", ".hf-cache")


@dataclass(frozen=True)
class Uploaded:
    uri: str
    files: int
    size: int


def outputs(folder: Path) -> list[Path]:
    """The files copied: the folder's, in name order, but those LEFT_OUT and hidden ones."""
    chosen = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        parts = path.relative_to(folder).parts
        if parts[0].startswith(LEFT_OUT) or any(part.startswith(".") for part in parts):
            continue
        chosen.append(path)
    return chosen


def _check(store: Any, where: Where, key: str, path: Path) -> None:
    head = store.head_object(Bucket=where.source.bucket, Key=key)
    size = path.stat().st_size
    parts = max(1, -(-size // PART)) if size >= PART else 1
    etag = str(head.get("ETag") or "").strip('"')
    wrong = int(head["ContentLength"]) != size or (
        etag and "-" not in etag and len(etag) == 32 and etag != file_etag(path, parts, PART)
    )
    if wrong:
        raise TrainerFailure(ExitReason.TrainerError, f"{where.field}: {key}: the stored copy differs from {path}")


def upload_outputs(where: Where, folder: Path) -> Uploaded:
    """Copy the outputs under `where`'s prefix; TrainerFailure naming the field when refused."""
    source = where.source
    assert isinstance(source, OutputS3)
    files = outputs(folder)
    store = client(where)
    config = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART, max_concurrency=4)
    log.info("copying %d files of %s to %s", len(files), folder, source.uri)
    try:
        for path in files:
            key = source.key + path.relative_to(folder).as_posix()
            store.upload_file(str(path), source.bucket, key, Config=config)
            _check(store, where, key, path)
    except (BotoCoreError, ClientError) as exc:
        raise refusal(where, exc) from None
    except Exception as exc:
        # boto3's transfer manager wraps the client's errors in its own.
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, (BotoCoreError, ClientError)):
            raise refusal(where, cause) from None
        raise
    done = Uploaded(source.uri, len(files), sum(p.stat().st_size for p in files))
    log.info("copied %d files (%s) to %s", done.files, describe_bytes(done.size), done.uri)
    return done

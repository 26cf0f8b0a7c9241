"""`ftjob upload LOCAL CLAIM[:PATH]`: copy a model folder or a dataset file into a PVC.

A short-lived pod mounts the claim and runs a small receiver (upload_receiver.py); the CLI
streams each file to it through the API server's pod proxy (pod_proxy.py), so it works wherever
`kubectl` does, with no exec and no route to the pod network. Each file lands as a partial file
first: a second run after an interruption asks the pod what arrived, checks that it is a prefix
of the local file (sha256 on both sides) and sends only the rest; the file takes its name only
once the sha256 of all of it matches the local one. Files already there with the same sha256 are
skipped.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from . import kube
from .errors import CliError
from .pod_proxy import PodProxy
from .progress import Progress, size
from .upload_pod import DEFAULT_IMAGE
from .upload_session import UploadTarget, delete_pod, open_session

BLOCK = 1 << 20
# One request carries at most this much: a dropped connection costs at most one segment's
# round trip, and no proxy between here and the pod holds a request open for hours.
SEGMENT = 256 << 20
CLAIM_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "upload",
        help="copy a model folder or dataset file into a PVC",
        description="Copy LOCAL (a model folder or a dataset file) into the PersistentVolumeClaim CLAIM at PATH "
        "(default: LOCAL's name at the claim's root), through a short-lived pod and the API server's pod "
        "proxy, with a progress bar. Rerun after an interruption to resume: what reached the claim is kept "
        "and checked; files already there with the same sha256 are skipped. Files are written mode 0644, "
        "readable by the trainer's uid.",
    )
    parser.add_argument("local", metavar="LOCAL")
    parser.add_argument("target", metavar="CLAIM[:PATH]")
    parser.add_argument(
        "--image",
        default=DEFAULT_IMAGE,
        metavar="IMAGE",
        help=f"the upload pod's image: any with python3 (default {DEFAULT_IMAGE}; the trainer image works too)",
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=180.0,
        metavar="SECONDS",
        help="how long the upload pod may take to start (default 180)",
    )
    kube.add_options(parser)
    parser.set_defaults(handler=run)


@dataclass(frozen=True)
class Item:
    local: Path
    remote: str
    size: int


def parse_target(text: str) -> tuple[str, str]:
    """`CLAIM[:PATH]` -> (claim, path inside it; '' for LOCAL's own name at the root)."""
    claim, _, path = text.partition(":")
    if not CLAIM_NAME.match(claim):
        raise CliError(f"CLAIM {claim!r}: not a claim name (lower-case letters, digits, '-' and '.')")
    parts = PurePosixPath(path.strip("/")).parts if path.strip("/") else ()
    if any(part in (".", "..") for part in parts):
        raise CliError(f"PATH {path!r}: no '.' or '..' parts")
    return claim, "/".join(parts) + ("/" if path.endswith("/") and parts else "")


def plan_items(local: Path, path: str) -> list[Item]:
    """Each file to send and where it lands: PATH is where LOCAL lands, a folder for a folder; a
    PATH ending in '/' is a folder to put LOCAL in, as with cp."""
    if not local.exists():
        raise CliError(f"LOCAL {local}: no such file or folder")
    landing = path + local.name if (not path or path.endswith("/")) else path
    if local.is_file():
        return [Item(local, landing, local.stat().st_size)]
    items = []
    for folder, subfolders, files in os.walk(local):
        subfolders.sort()
        for name in sorted(files):
            file = Path(folder) / name
            if file.is_file():  # follows links to files, as a Hub cache snapshot holds them
                relative = file.relative_to(local).as_posix()
                items.append(Item(file, f"{landing}/{relative}", file.stat().st_size))
    if not items:
        raise CliError(f"LOCAL {local}: no files in it")
    return items


def hash_prefix(handle: IO[bytes], length: int) -> hashlib._Hash:
    digest = hashlib.sha256()
    while length > 0:
        block = handle.read(min(BLOCK, length))
        if not block:
            break
        digest.update(block)
        length -= len(block)
    return digest


def whole_hash(path: Path) -> str:
    with path.open("rb") as handle:
        return hash_prefix(handle, path.stat().st_size).hexdigest()


def _blocks(handle: IO[bytes], length: int, digest: hashlib._Hash, progress: Progress) -> Iterator[bytes]:
    while length > 0:
        block = handle.read(min(BLOCK, length))
        if not block:
            raise CliError(f"{handle.name}: the file shrank during the upload")
        digest.update(block)
        progress.advance(len(block))
        length -= len(block)
        yield block


def _resume_offset(proxy: PodProxy, item: Item, handle: IO[bytes], progress: Progress) -> tuple[int, hashlib._Hash]:
    """Where to continue: the partial file's size when it is a prefix of the local file, else 0."""
    state = proxy.call("GET", "stat", {"path": item.remote, "hash": "partial"})
    held = state.body.get("partial")
    if state.status != 200:
        raise CliError(f"{item.remote}: {state.error}")
    if isinstance(held, int) and 0 < held <= item.size:
        digest = hash_prefix(handle, held)
        if digest.copy().hexdigest() == state.body.get("partialSha256"):
            progress.note(f"{item.remote}: resuming at {size(held)} of {size(item.size)}")
            progress.skip(held)
            return held, digest
        progress.note(f"{item.remote}: the partial file in the claim is not this file's start; starting over")
        handle.seek(0)
    if held is not None:
        proxy.call("POST", "discard", {"path": item.remote})
    return 0, hashlib.sha256()


def _already_there(proxy: PodProxy, item: Item, progress: Progress) -> str | None:
    """The file's sha256 when the claim holds it already, whole and the same."""
    state = proxy.call("GET", "stat", {"path": item.remote})
    if state.status != 200:
        raise CliError(f"{item.remote}: {state.error}")
    if state.body.get("size") != item.size or state.body.get("partial") is not None:
        return None
    remote = proxy.call("GET", "stat", {"path": item.remote, "hash": "final"}).body.get("sha256")
    local = whole_hash(item.local)
    if remote != local:
        return None
    progress.note(f"{item.remote}: already in the claim with the same sha256, skipped")
    progress.skip(item.size)
    return local


def send(proxy: PodProxy, item: Item, progress: Progress) -> str:
    """Send one file (the rest of it, when a partial file is its start); its verified sha256."""
    if (same := _already_there(proxy, item, progress)) is not None:
        return same
    with item.local.open("rb") as handle:
        offset, digest = _resume_offset(proxy, item, handle, progress)
        while True:  # one append at least: an empty file is one empty append
            length = min(SEGMENT, item.size - offset)
            query = {"path": item.remote, "offset": str(offset)}
            reply = proxy.call("PUT", "append", query, _blocks(handle, length, digest, progress), length)
            if reply.status != 200:
                raise CliError(f"{item.remote}: {reply.error} (another upload to the same path?); run it again")
            offset = int(reply.body["partial"])
            if offset >= item.size:
                break
    sha256 = digest.hexdigest()
    finished = proxy.call("POST", "finish", {"path": item.remote, "sha256": sha256})
    if finished.status != 200:
        raise CliError(f"{item.remote}: the claim's copy differs from {item.local} ({finished.error}); run it again")
    return sha256


def run(args: argparse.Namespace) -> int:
    claim, path = parse_target(args.target)
    items = plan_items(Path(args.local), path)
    cluster = kube.connect(args)
    proxy, reused = open_session(cluster, UploadTarget(claim, args.image, args.start_timeout))
    progress = Progress(sum(item.size for item in items))
    try:
        if reused:
            progress.note(f"reusing upload pod {proxy.pod} from an earlier upload")
        sums = [(item, send(proxy, item, progress)) for item in items]
    finally:
        progress.close()
        delete_pod(cluster, proxy.pod)
    for item, sha256 in sums:
        print(f"{sha256}  {claim}:{item.remote}")
    rate = f"{size(progress.rate)}/s" if progress.sent else "nothing to send"
    print(
        f"uploaded {len(items)} file(s), {size(progress.total)}, to claim {claim} in namespace {cluster.namespace}: "
        f"sent {size(progress.sent)} in {progress.elapsed:.1f} s ({rate}); sha256 verified"
    )
    return 0

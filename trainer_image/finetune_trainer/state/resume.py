"""The checkpoint every rank resumes from, wherever the rank runs.

In one pod every rank reads the newest complete checkpoint from the output volume, as it always
did. Ranks of a job of several nodes run in other pods, on other machines, which may not mount
that volume (or see it late, through a network filesystem's cache): there rank 0 alone chooses
the checkpoint, reads its files and broadcasts them, and every other rank restores from its own
copy in a private temporary folder, removed once restored. So every rank resumes from exactly
the checkpoint rank 0 chose, and only rank 0 ever touches the checkpoint folder.

The files travel over gloo, on the host, whatever the training backend: a checkpoint (the
adapter, its optimizer state) need not fit in GPU memory beside the model.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ..distributed.topology import Topology
from .checkpoints import Checkpoint, CheckpointStore


def _read(checkpoint: Checkpoint) -> dict[str, Any]:
    files = {
        str(path.relative_to(checkpoint.path)): path.read_bytes()
        for path in sorted(checkpoint.path.rglob("*"))
        if path.is_file()
    }
    return {
        "name": checkpoint.name,
        "step": checkpoint.step,
        "micro": checkpoint.micro,
        "time": checkpoint.time,
        "files": files,
    }


def _write(payload: dict[str, Any]) -> Checkpoint:
    folder = Path(tempfile.mkdtemp(prefix="finetune-resume-")) / payload["name"]
    for relative, data in payload["files"].items():
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return Checkpoint(int(payload["step"]), folder, str(payload["time"]), int(payload["micro"]))


def broadcast_checkpoint(store: CheckpointStore, ranks: Topology) -> Checkpoint | None:
    """Rank 0's newest complete checkpoint, as a copy of its files on every other rank."""
    chosen = store.latest() if ranks.is_main else None
    box: list[Any] = [_read(chosen) if chosen is not None else None] if ranks.is_main else [None]
    group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
    # The group stays until the process ends: destroying a gloo group mid-run is what the
    # workers' teardown avoids too (see recipe.Recipe.run).
    dist.broadcast_object_list(box, src=0, group=group)
    if ranks.is_main or box[0] is None:
        return chosen
    return _write(box[0])


@contextmanager
def resume_point(store: CheckpointStore, ranks: Topology) -> Iterator[Checkpoint | None]:
    """The checkpoint to restore from, for the duration of the restore."""
    if not ranks.spans_pods:
        yield store.latest()
        return
    checkpoint = broadcast_checkpoint(store, ranks)
    try:
        yield checkpoint
    finally:
        if checkpoint is not None and not ranks.is_main:
            shutil.rmtree(checkpoint.path.parent, ignore_errors=True)

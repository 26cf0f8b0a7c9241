"""One process: the whole model on its one device, nothing to reduce or shard.

A spec's dataParallel or fsdp on a world of one process runs this (FSDP over one process would
shard nothing: it would run NO_SHARD); the summary and checkpoints keep the spec's word.
A checkpoint holds the adapter and its optimizer state, as in every mode: any process count
resumes it. Its peak is this process's GPU.
"""

from __future__ import annotations

from .base import Mode


class SingleProcess(Mode):
    """Every default of `Mode`: one device, one process, a reduction that returns at once."""

"""dataParallel: one process per GPU (or CPU slot), each with a whole NF4 copy on its device.

Each rank runs its own micro-batches; one collective per step sums the adapter's gradients
(`distributed.gradsync`), so N processes with accumulation k train the adapter of one process
with N x k. The checkpoint holds the adapter and its optimizer state, the same on every rank
(rank 0 writes it); each rank's peak is measured on its own GPU.
"""

from __future__ import annotations

from .base import Mode


class DataParallel(Mode):
    """Every default of `Mode`: a whole copy per rank, gradients summed over the ranks."""

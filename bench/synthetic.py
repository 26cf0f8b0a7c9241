"""The reference recipe's data stream, reproduced: one `randint` draw per micro-batch.

seed_baseline.py draws `torch.randint(0, vocab, (1, seq))` on the first GPU for every step.
Started with `torch.manual_seed(seed)`, its stream is the Philox sequence of that seed, which a
fresh generator with the same seed repeats on any device. Global micro-batch `i` is the i-th
draw, so ours and the reference train on the same tokens.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def micro_batch_stream(seed: int, vocab: int, seq: int, device: torch.device) -> Iterator[torch.Tensor]:
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    while True:
        yield torch.randint(0, vocab, (1, seq), device=device, generator=generator)


def take(stream: Iterator[torch.Tensor], indices: list[int], position: list[int]) -> list[torch.Tensor]:
    """Draw up to the highest index in `indices`, keep those; `position[0]` counts draws made."""
    wanted = set(indices)
    kept = []
    while position[0] <= max(indices):
        batch = next(stream)
        if position[0] in wanted:
            kept.append(batch)
        position[0] += 1
    return kept

"""Layer placement for `device_map` mode: contiguous blocks of layers, embeddings on the first
GPU, final norm + lm_head + loss on the last, balanced so the fullest GPU has the most room.

The result is both an explicit `device_map` (module name -> GPU index, exact) and the
`max_memory` budget (GPU index -> bytes of weights) for `from_pretrained`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

MARGIN_RESOLUTION = 2**20  # bytes: finer than any layer
QUANTISED_ACCOUNTING_BYTES = 0.5  # how accelerate sizes a 4-bit parameter when it plans a device_map


@dataclass(frozen=True)
class Placement:
    layers_per_gpu: tuple[int, ...]

    def first_layer(self, gpu: int) -> int:
        return sum(self.layers_per_gpu[:gpu])

    def device_map(self) -> dict[str, int]:
        """Module names of a Hugging Face Llama-style model -> CUDA index."""
        last = len(self.layers_per_gpu) - 1
        mapping: dict[str, int] = {"model.embed_tokens": 0, "model.rotary_emb": 0}
        layer = 0
        for gpu, count in enumerate(self.layers_per_gpu):
            for _ in range(count):
                mapping[f"model.layers.{layer}"] = gpu
                layer += 1
        mapping["model.norm"] = last
        mapping["lm_head"] = last
        return mapping


def balance(
    layers: int,
    capacities: Sequence[float],
    total_for: Callable[[int, int], float],
) -> Placement:
    """Split `layers` into one contiguous block per GPU, maximising the smallest headroom.

    `total_for(gpu, count)` is the peak bytes of `gpu` holding `count` layers (it includes the
    embeddings on GPU 0 and the head and loss on the last GPU); it must grow with `count`.
    """
    gpus = len(capacities)
    if gpus == 1:
        return Placement((layers,))
    # The bisection over margins asks the same (gpu, count) again and again (a 70B plan: 17,000
    # calls for a few hundred pairs); the figure is a pure function of the pair.
    total_for = functools.cache(total_for)

    def fits(gpu: int, count: int, margin: float) -> bool:
        return total_for(gpu, count) <= capacities[gpu] - margin

    def most(gpu: int, left: int, margin: float) -> int:
        """The most layers (up to `left`) that `gpu` takes under the margin, by bisection."""
        low, high = 0, left
        while low < high:
            middle = (low + high + 1) // 2
            if fits(gpu, middle, margin):
                low = middle
            else:
                high = middle - 1
        return low

    def fill(margin: float, order: list[int]) -> tuple[int, ...] | None:
        """Greedy in `order`: each GPU takes all it can; the last one takes the rest."""
        counts = [0] * gpus
        left = layers
        for gpu in order[:-1]:
            counts[gpu] = most(gpu, left, margin) if fits(gpu, 0, margin) else 0
            left -= counts[gpu]
        counts[order[-1]] = left
        return tuple(counts) if all(fits(g, c, margin) for g, c in enumerate(counts)) else None

    forward = list(range(gpus))
    scale = max(capacities) + max(total_for(g, layers) for g in range(gpus))
    low, high = -scale, scale  # fill(low) always succeeds: every margin is reachable
    best = fill(low, forward)
    while high - low > MARGIN_RESOLUTION:
        middle = (low + high) / 2
        found = fill(middle, forward)
        if found is None:
            high = middle
        else:
            low, best = middle, found
    assert best is not None
    # Front-greedy packs the first GPUs; back-greedy the last ones. Boundaries halfway between
    # the two spread the layers evenly and stay within the same best margin.
    back = fill(low, forward[::-1])
    if back is not None:
        ahead = [sum(best[: g + 1]) for g in range(gpus)]
        behind = [sum(back[: g + 1]) for g in range(gpus)]
        bounds = [(a + b) // 2 for a, b in zip(ahead, behind, strict=True)]
        even = tuple(bounds[g] - (bounds[g - 1] if g else 0) for g in range(gpus))
        if all(fits(g, c, low) for g, c in enumerate(even)):
            best = even
    return Placement(best)


def max_memory(
    placement: Placement,
    layer_accounting_bytes: float,
    embedding_bytes: float,
    head_bytes: float,
) -> dict[int, int]:
    """Per-GPU weight budget in accelerate's own accounting (4-bit weights at half a byte),
    with half a layer of margin, the largest module that accelerate holds back on the first
    GPU, and transformers' 10% cut for 4-bit loading undone, so `device_map="auto"` with it
    reproduces `placement` (the explicit `Placement.device_map()` is exact)."""
    budget: dict[int, int] = {}
    last = len(placement.layers_per_gpu) - 1
    for gpu, count in enumerate(placement.layers_per_gpu):
        weights = (count + 0.5) * layer_accounting_bytes
        if gpu == 0:
            weights += embedding_bytes + max(layer_accounting_bytes, embedding_bytes, head_bytes)
        if gpu == last:
            weights += head_bytes
        budget[gpu] = int(weights / 0.9)
    return budget

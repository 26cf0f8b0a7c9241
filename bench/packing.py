"""Packing on a realistic length mix: non-padding tokens/s, packed rows vs one sample per step.

Lengths are drawn like an instruction dataset (log-normal, median ~250 tokens, long tail,
clipped to [32, max_length]). The reference recipe trains at batch 1: one sample per
micro-batch. Ours packs samples into max_length rows; `position_ids` restart at every sample
so attention stays inside each sample (transformers turns restarting positions into a
block-diagonal causal mask), and the first token of each sample is not a label, so no sample
learns from its neighbour. Both run 8 micro-batches per optimizer step.

    python -m bench.packing '{"path": ..., "mode": "packed"|"per_sample", "samples": 96, "max_length": 2048}'
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from typing import Any

import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

IGNORE = -100


def length_mix(count: int, max_length: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [max(32, min(max_length, round(rng.lognormvariate(math.log(250), 0.8)))) for _ in range(count)]


def pack(lengths: list[int], max_length: int) -> list[list[int]]:
    """First-fit-decreasing bins of sample indices, each bin's total <= max_length."""
    bins: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, free in enumerate(room):
            if lengths[index] <= free:
                bins[b].append(index)
                room[b] -= lengths[index]
                break
        else:
            bins.append([index])
            room.append(max_length - lengths[index])
    return bins


def packed_row(samples: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, position_ids, labels) of one packed row, batch dimension 1."""
    ids = torch.cat(samples)
    positions = torch.cat([torch.arange(len(s), device=s.device) for s in samples])
    labels = ids.clone()
    starts = torch.cumsum(torch.tensor([0] + [len(s) for s in samples[:-1]]), 0)
    labels[starts.to(ids.device)] = IGNORE  # never predict a sample's first token from the one before
    return ids[None], positions[None], labels[None]


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import bitsandbytes as bnb

    from finetune_trainer.distributed import qlora

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    max_length = spec.get("max_length", 2048)
    lengths = length_mix(spec.get("samples", 96), max_length, spec.get("seed", 0))
    model = qlora.load(spec["path"], device, qlora.QloraRecipe(), seed=spec.get("seed", 0))
    params = qlora.trainable_parameters(model)
    optimizer = bnb.optim.PagedAdamW8bit(params, lr=1e-4)
    generator = torch.Generator(device=device)
    generator.manual_seed(spec.get("seed", 0))
    vocab = model.config.vocab_size
    samples = [torch.randint(0, vocab, (n,), device=device, generator=generator) for n in lengths]
    if spec["mode"] == "packed":
        micro = [packed_row([samples[i] for i in b]) for b in pack(lengths, max_length)]
    else:
        micro = [(s[None], torch.arange(len(s), device=device)[None], s[None]) for s in samples]
    accumulation, warm = 8, spec.get("warm", 8)

    def step(batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], index: int) -> None:
        ids, positions, labels = batch
        # use_cache=False: with a cache, transformers would not turn restarting positions into a mask.
        loss = model(input_ids=ids, position_ids=positions, labels=labels, use_cache=False).loss
        (loss / accumulation).backward()
        if (index + 1) % accumulation == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    for index in range(warm):
        step(micro[index % len(micro)], index)
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.time()
    for index, batch in enumerate(micro):
        step(batch, index)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.time() - start
    return dict(
        mode=spec["mode"],
        samples=len(lengths),
        mean_length=round(sum(lengths) / len(lengths), 1),
        micro_batches=len(micro),
        tokens=sum(lengths),
        seconds=round(seconds, 2),
        real_tok_s=round(sum(lengths) / seconds, 1),
    )


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))), flush=True)

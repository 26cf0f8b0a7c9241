"""Our data-parallel trainer on the reference's shape and data, timed like the reference.

Run under torchrun (one process per GPU) by bench.run; rank 0 prints one JSON line.
    python -m torch.distributed.run --nproc-per-node N -m bench.ours '{"path": ..., "seq": 2048, ...}'
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

from bench.synthetic import micro_batch_stream, take  # noqa: E402
from finetune_trainer.distributed import gradsync, qlora, shards, topology  # noqa: E402
from finetune_trainer.distributed.step import train_step  # noqa: E402
from finetune_trainer.precision_guard import GuardReport, scan_tensors, watch_activations  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _gather(value: Any, topo: topology.Topology) -> list[Any]:
    if topo.world_size == 1:
        return [value]
    out: list[Any] = [None] * topo.world_size
    dist.all_gather_object(out, value)
    return out


def run(spec: dict[str, Any]) -> dict[str, Any] | None:
    topo = topology.from_env()
    topology.start(topo)
    device = topo.device
    seq, steps, warm = spec["seq"], spec["steps"], spec.get("warm", 2)
    per_rank = spec.get("per_rank", 1)
    seed = spec.get("seed", 0)
    recipe = qlora.QloraRecipe(
        gradient_checkpointing=spec.get("ckpt", True), attn_implementation=spec.get("attn", "sdpa")
    )
    start = time.time()
    model = qlora.load(spec["path"], device, recipe, seed=spec.get("lora_seed", seed))
    load_s = time.time() - start
    params = qlora.trainable_parameters(model)
    gradsync.broadcast_parameters(params)
    import bitsandbytes as bnb

    optimizer = bnb.optim.PagedAdamW8bit(params, lr=spec.get("lr", 1e-4))
    vocab = model.config.vocab_size
    stream = micro_batch_stream(seed, vocab, seq, device)
    position = [0]
    global_per_step = per_rank * topo.world_size
    guard = GuardReport()
    scan_tensors(model, guard)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, losses = [], []
    for step in range(warm + steps):
        batches = take(stream, shards.rank_indices(step, global_per_step, topo.rank, topo.world_size), position)
        _sync(device)
        if topo.world_size > 1:
            dist.barrier()
        t = time.time()
        if step == 0:
            with watch_activations(model, guard):
                loss = train_step(model, optimizer, batches, params, world_size=topo.world_size)
        else:
            loss = train_step(model, optimizer, batches, params, world_size=topo.world_size)
        _sync(device)
        elapsed = time.time() - t
        if topo.world_size > 1:
            both = torch.tensor([elapsed, loss.item()], device=device, dtype=torch.float64)
            dist.all_reduce(both, op=dist.ReduceOp.SUM)
            elapsed_max = torch.tensor([elapsed], device=device, dtype=torch.float64)
            dist.all_reduce(elapsed_max, op=dist.ReduceOp.MAX)
            elapsed, mean_loss = float(elapsed_max.item()), float(both[1].item()) / topo.world_size
        else:
            mean_loss = float(loss.item())
        if step >= warm:
            times.append(elapsed)
        losses.append(mean_loss)
    peak = round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else 0.0
    peaks = _gather(peak, topo)
    half = guard.half_parameters + guard.half_buffers + guard.half_activations
    guards = _gather({"half": half[:20], **guard.summary()}, topo)
    in_sync = gradsync.all_equal(params)
    topology.stop()
    if not topo.is_main:
        return None
    tokens = seq * global_per_step * len(times)
    return dict(
        seq=seq,
        ckpt=recipe.gradient_checkpointing,
        attn=recipe.attn_implementation,
        gpus=topo.world_size,
        per_rank=per_rank,
        tok_s=round(tokens / sum(times), 1),
        step_s=round(sum(times) / len(times), 3),
        peak_gib=peaks,
        load_s=round(load_s, 1),
        half_tensors=[h for rank in guards for h in rank["half"]],
        guard=[{k: v for k, v in rank.items() if k != "half"} for rank in guards],
        adapters_in_sync=in_sync,
        losses=[round(x, 5) for x in losses],
        loss_first=round(losses[0], 3),
        loss_last=round(losses[-1], 3),
    )


if __name__ == "__main__":
    result = run(json.loads(sys.argv[1]))
    if result is not None:
        print(json.dumps(result), flush=True)

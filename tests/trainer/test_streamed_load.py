"""fsdp's streamed loader gives today's model bit for bit, reading each checkpoint byte once per pod.

Two processes (gloo on the CPU; NCCL on GPUs) each load the tiny model twice through the
trainer's own functions: streamed (meta model, each tensor read and quantised by one owner rank,
broadcast, sharded by FSDP unit by unit) and as fsdp loaded before (the whole packed model on the
host in each process). Every parameter, the adapter's initial weights, every buffer, every
packed 4-bit weight and every tensor and field of its quantisation state must be equal, and the
ranks' bytes read must add up to the checkpoint's tensors exactly once.

On the CPU bitsandbytes quantises with its CPU kernel; the GPU test runs the same comparison with
its CUDA kernel (skipped without a GPU; on one GPU it runs one process, which still streams,
quantises on the GPU and shards): `python -m pytest tests/trainer/test_streamed_load.py` on a GPU
machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import REPO

pytestmark = pytest.mark.trainer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tensor_bytes(model_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    for path in model_dir.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():
                tensor = handle.get_tensor(key)
                total += tensor.numel() * tensor.element_size()
    return total


def _load_both_ways(model_dir: Path, out: Path, world: int, gpu: bool) -> list[dict[str, object]]:
    port = str(_free_port())
    ranks = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1"}
        env.update(MASTER_PORT=port, OMP_NUM_THREADS="1")
        args = [sys.executable, "-m", "tests.trainer.streamed_load_worker", str(model_dir), str(out / f"{rank}.json")]
        ranks.append(subprocess.Popen([*args, *(["--gpu"] if gpu else [])], env=env, cwd=REPO, stderr=subprocess.PIPE, text=True))
    errors = [p.communicate(timeout=600)[1] for p in ranks]
    for process, error in zip(ranks, errors, strict=True):
        assert process.returncode == 0, error[-3000:]
    return [json.loads((out / f"{rank}.json").read_text()) for rank in range(world)]


def _check(results: list[dict[str, object]], model_dir: Path) -> None:
    for rank, result in enumerate(results):
        assert result["differences"] == [], f"rank {rank}: {result['differences']}"
        assert isinstance(result["compared"], int) and result["compared"] > 20
    read = [int(str(r["bytesRead"])) for r in results]
    assert sum(read) == _tensor_bytes(model_dir)
    if len(read) > 1:
        # Shared: no rank read the checkpoint alone.
        assert all(0 < b < sum(read) for b in read)


def test_two_processes_stream_todays_model_bit_for_bit_reading_each_byte_once(tiny_assets: Path, tmp_path: Path) -> None:
    model_dir = tiny_assets / "models" / "tiny-llama"
    _check(_load_both_ways(model_dir, tmp_path, 2, gpu=False), model_dir)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_gpus_the_streamed_nf4_weights_equal_todays_bit_for_bit(tiny_assets: Path, tmp_path: Path) -> None:
    model_dir = tiny_assets / "models" / "tiny-llama"
    _check(_load_both_ways(model_dir, tmp_path, min(2, torch.cuda.device_count()), gpu=True), model_dir)

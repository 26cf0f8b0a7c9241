"""fsdp's streamed loader gives the model of the loader before it, bit for bit, reading each
checkpoint byte once per pod.

`bench.streamed_load` runs the processes of one pod (two, gloo on the CPU; one per GPU with
NCCL), each loading the model twice through the trainer's own `load_model` and `Fsdp.wrap`:
streamed (meta model, each tensor read and quantised by one owner rank, broadcast, sharded by
FSDP unit by unit) and as fsdp loaded before (the whole packed model on the host in each
process). Every parameter, the adapter's initial weights, every buffer, every packed 4-bit
weight and every tensor and field of its quantisation state must be equal, and the ranks' bytes
read must add up to the checkpoint's tensor bytes: each read once, by one rank.

On the CPU bitsandbytes quantises with its CPU kernel; the GPU test runs the same comparison with
its CUDA kernel (skipped without a GPU; one GPU runs one process, which still streams, quantises
on the GPU and shards). On a GPU machine: `python tests/trainer/test_streamed_load.py [MODEL_DIR]`
(a wider tiny model made here when no folder is given).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.streamed_load import run

pytestmark = pytest.mark.trainer


def check(summary: dict[str, Any]) -> None:
    assert not summary["failed"], summary["failed"]
    ranks = summary["ranks"]
    assert len(ranks) == summary["world"]
    for result in ranks:
        assert result["differences"] == [], f"rank {result['rank']}: {result['differences'][:20]}"
        assert result["compared"] > 20
        assert result["streamedWithinBound"], result
    read = [r["bytesRead"] for r in ranks]
    assert sum(read) == summary["checkpointTensorBytes"]
    if len(read) > 1:
        # Shared: every rank read some of it, none all of it.
        assert all(0 < b < sum(read) for b in read)


@pytest.mark.parametrize("quantization", ["nf4", "none"])
def test_two_processes_stream_the_model_of_before_bit_for_bit_reading_each_byte_once(
    tiny_assets: Path, tmp_path: Path, quantization: str
) -> None:
    model = str(tiny_assets / "models" / "tiny-llama")
    check(run({"path": model, "gpus": 0, "work": str(tmp_path), "quantization": quantization}))


@pytest.mark.gpu  # skipped where no CUDA GPU is visible (tests/conftest.py)
def test_on_gpus_the_streamed_nf4_weights_equal_those_of_before_bit_for_bit(tiny_assets: Path, tmp_path: Path) -> None:
    gpus = min(2, torch.cuda.device_count())
    check(run({"path": str(tiny_assets / "models" / "tiny-llama"), "gpus": gpus, "work": str(tmp_path)}))


if __name__ == "__main__":
    import tempfile

    from finetune_trainer.model.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory() as work:
        # Wider than the pytest model: thousands of 4-bit blocks per weight.
        wide = {"hidden": 1024, "intermediate": 4096, "heads": 16, "kv_heads": 4}
        model = Path(sys.argv[1]) if len(sys.argv) > 1 else make_tiny_model(Path(work) / "wide-llama", **wide)
        summary = run({"path": str(model), "gpus": min(2, torch.cuda.device_count()), "work": work})
        check(summary)
    print(json.dumps({"event": "streamed-gpu-test", "passed": True, **summary}))

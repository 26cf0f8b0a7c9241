"""Data-parallel QLoRA is the same math as one process accumulating the same micro-batches.

Two CPU processes (gloo) each train one micro-batch per step; one process trains both with
gradient accumulation 2. Same NF4 model, same LoRA init, same tokens: the loss curves must
agree, and both ranks must end with bit-identical adapters.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.tiny_llama import write_tiny_llama

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.trainer


def _run(argv: list[str], tmp_path: Path) -> dict[str, object]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    paths = [str(REPO), str(REPO / "operator"), str(REPO / "trainer_image"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


def test_two_ranks_match_one_process_with_accumulation(tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "tiny")
    spec = {"path": str(model), "seq": 64, "steps": 3, "warm": 1, "seed": 7, "lr": 1e-3}
    single = _run([sys.executable, "-m", "bench.ours", json.dumps({**spec, "per_rank": 2})], tmp_path)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    parallel = _run([*launcher, "-m", "bench.ours", json.dumps({**spec, "per_rank": 1})], tmp_path)
    assert parallel["gpus"] == 2 and single["gpus"] == 1
    assert parallel["adapters_in_sync"] is True
    assert parallel["losses"] == pytest.approx(single["losses"], rel=1e-4, abs=1e-5)
    assert parallel["half_tensors"] == []

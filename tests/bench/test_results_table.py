"""The README table and the result records come out of the committed JSON, not by hand."""

import json
from pathlib import Path

from bench.flops import Shape
from bench.report import compare_record, gpu_slug
from bench.table import HEADER, render

SHAPE = Shape(layers=4, hidden=8192, inter=28672, heads=64, kv=8, vocab=128256)
REF = {"tok_s": 1841.0, "peak_gib": [8.1, 8.3], "loss_first": 11.9, "loss_last": 11.8, "half_params": []}
OURS = {"tok_s": 3600.0, "peak_gib": [15.0, 15.0], "loss_first": 11.9, "loss_last": 11.81, "half_tensors": []}


def record(**changes: object) -> dict[str, object]:
    base = compare_record(
        date="2026-11-30",
        shape=SHAPE,
        seq=2048,
        steps=4,
        warm=2,
        seed=0,
        gpus=2,
        peaks=[{"fp32_matmul_tflops": 51.2, "gpu": "NVIDIA H200"}] * 2,
        reference=REF,
        ours=OURS,
        versions={},
    )
    return base | changes


def test_record_has_ratio_mfu_and_loss_difference() -> None:
    rec = record()
    assert rec["ratio"] == round(3600 / 1841, 3)
    assert rec["ours_mfu_per_gpu"] > rec["reference_mfu_per_gpu"]
    assert rec["loss"]["relative_difference"] == round(0.01 / 11.8, 4)


def test_table_lists_each_result_file(tmp_path: Path) -> None:
    (tmp_path / "2026-11-30-h200-2gpu.json").write_text(json.dumps(record(mode="fsdp-nop2p")))
    (tmp_path / "2026-11-30-h200-layer-memory.json").write_text(json.dumps({"shape": {}}))
    text = render(tmp_path)
    assert text.startswith(HEADER)
    rows = text.splitlines()[2:]
    assert len(rows) == 1
    assert "| 4 | 2 | fsdp-nop2p (NCCL_P2P_DISABLE=1) | 1 GPU | 1841 | 3600 | 1.955x |" in rows[0]


def test_a_failed_run_is_left_out_of_the_table(tmp_path: Path) -> None:
    (tmp_path / "2026-11-30-h200-1gpu.json").write_text(json.dumps(record(ours={"error": "OOM"})))
    assert "no results committed yet" in render(tmp_path)


def test_gpu_slug() -> None:
    assert gpu_slug([{"gpu": "NVIDIA H200"}]) == "h200"
    assert gpu_slug([{"gpu": "Tesla P40"}]) == "p40"


def test_a_job_of_several_nodes_says_so(tmp_path: Path) -> None:
    ours = {**OURS, "parallelism": "dataParallel"}
    (tmp_path / "2026-12-01-h200-2node.json").write_text(json.dumps(record(mode="2 nodes", nodes=2, ours=ours)))
    (rows,) = render(tmp_path).splitlines()[2:]
    assert "| 2 | 2 nodes x 1 GPU, dataParallel, NCCL over TCP | 1 GPU |" in rows

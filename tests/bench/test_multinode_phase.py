"""The bench's `multinode` phase runs what a job of 2 nodes runs: two launchers with the Indexed
Job's environment, one GPU each, against the 1-GPU reference of the same call."""

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import trainer_job
from bench.run import DEFAULT_PHASES, PHASES, Bench, parse_args
from finetune_api import multinode


def test_two_nodes_are_two_launchers_with_the_indexed_jobs_environment_and_a_gpu_each(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"paths": {"output": str(tmp_path / "output")}}))
    spec = {"work": str(tmp_path), "nodes": 2, "gpus": 1, "socket": True}
    started = trainer_job.launchers(spec, config, {"CUDA_VISIBLE_DEVICES": "0,1", "KEEP": "1"})
    assert len(started) == 2
    ports = set()
    for index, (argv, env) in enumerate(started):
        assert argv[:3] == [sys.executable, "-m", "finetune_trainer"]
        assert env[multinode.NNODES_ENV] == "2"
        assert env[multinode.NODE_RANK_ENV] == str(index)
        assert env["CUDA_VISIBLE_DEVICES"] == str(index)
        assert env[multinode.NODE_ADDR_ENV] == f"127.0.0.{index + 1}"
        assert (env["NCCL_P2P_DISABLE"], env["NCCL_SHM_DISABLE"], env["KEEP"]) == ("1", "1", "1")
        host, _, port = env[multinode.RDZV_ENDPOINT_ENV].rpartition(":")
        assert host == "127.0.0.1"
        ports.add(port)
    assert len(ports) == 1, "both launchers meet at one rendezvous"
    # Node 1 writes elsewhere: it must not need node 0's output folder.
    second = json.loads(Path(started[1][0][-1]).read_text())
    assert second["paths"]["output"] != str(tmp_path / "output")
    assert started[0][0][-1] == str(config)


def test_one_node_is_the_pods_command_as_before(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    [(argv, env)] = trainer_job.launchers({"work": str(tmp_path)}, config, {"A": "1"})
    assert argv == [sys.executable, "-m", "finetune_trainer", "--config", str(config)]
    assert env == {"A": "1"}


def test_too_few_gpus_for_the_nodes_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        trainer_job.launchers(
            {"work": str(tmp_path), "nodes": 2, "gpus": 1}, tmp_path / "c", {"CUDA_VISIBLE_DEVICES": "0"}
        )


RUN = {"loss_first": 12.0, "loss_last": 11.9}


def test_the_phase_compares_two_nodes_with_the_one_gpu_reference_and_writes_the_2node_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "multinode" in PHASES and "multinode" not in DEFAULT_PHASES
    args = parse_args(["--shared", str(tmp_path), "--work", str(tmp_path / "w"), "--results", str(tmp_path / "r")])
    bench = Bench(args)
    (bench.model).mkdir(parents=True)
    (bench.model / "config.json").write_text("{}")
    children: list[tuple[str, list[str], int]] = []

    def child(name: str, argv: list[str], gpus: int, timeout: float = 900.0) -> list[dict[str, Any]]:
        children.append((name, argv, gpus))
        if name == "reference-1gpu":
            return [{"tok_s": 1000.0, **RUN, "peak_gib": [14.0]}]
        return [
            {"event": "bench-summary", "tok_s": 1900.0, "exit_code": 0, "worldSize": 2, **RUN, "peak_gib": [14.0] * 2}
        ]

    monkeypatch.setattr(bench, "child", child)
    peaks = [{"gpu": "NVIDIA H200", "fp32_matmul_tflops": 51.2}] * 2
    bench.multinode(peaks, versions={})
    assert [(name, gpus) for name, _, gpus in children] == [("reference-1gpu", 1), ("ours-2node", 2)]
    spec = json.loads(children[1][1][-1])
    assert (spec["nodes"], spec["gpus"], spec["socket"]) == (2, 1, True)
    assert children[1][1][1:3] == ["-m", "bench.trainer_job"]
    [written] = list((tmp_path / "r").glob("*-2node.json"))
    record = json.loads(written.read_text())
    assert record["nodes"] == 2 and record["gpus"] == 2
    assert record["ratio"] == pytest.approx(1.9)

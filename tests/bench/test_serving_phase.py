"""The bench's `serving` phase (bench/serving.py) before its one GPU call: the flags it builds with
are the serving image's, for this machine's architecture; the packed source holds what the
build reads in under the 64 MiB a GPU call carries; and the whole phase runs on the CPU at tiny
sizes with llama-server built from the pinned sdist (the tests' copy): the base with its adapter
and the merged GGUF answer, each with PEFT's greedy tokens, and the record says so."""

import json
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from bench import serving
from bench.run import DEFAULT_PHASES, NO_PEAK_PHASES, PHASES, Bench, parse_args
from hack import llama_cpp as pinned


def test_the_phase_builds_with_the_serving_images_flags_for_this_machine() -> None:
    version, flags = serving.image_build()
    assert version == pinned.VERSION
    assert flags[: len(pinned.SERVING_CMAKE_FLAGS)] == list(pinned.SERVING_CMAKE_FLAGS)
    on_h100 = serving.machine_flags(flags, "90")
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in on_h100 and len(on_h100) == len(flags)
    on_cpu = serving.machine_flags(flags, None)
    assert not [f for f in on_cpu if "CUDA" in f] and set(on_cpu) < set(flags)


def test_the_phase_writes_its_record_from_the_childs_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "serving" in PHASES and "serving" not in DEFAULT_PHASES and "serving" in NO_PEAK_PHASES
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "llama-cpp.tar.gz").write_bytes(b"")
    argv = ["--shared", str(tmp_path), "--work", str(tmp_path / "w"), "--results", str(tmp_path / "r")]
    bench = Bench(parse_args([*argv, "--phases", "serving", "--serving-source", str(tmp_path / "src")]))

    def child(name: str, argv: list[str], gpus: int, timeout: float = 900.0) -> list[dict[str, Any]]:
        assert (name, gpus, argv[:4]) == ("serving", 1, [sys.executable, "-m", "bench.serving", "run"])
        spec = json.loads(argv[4])
        assert spec["source"] == str(tmp_path / "src" / "llama-cpp.tar.gz") and spec["sizes"]["layers"] == 16
        return [{"event": "bench-serving", "phase": "serving", "adapter": {"greedyEqualsPeft": True}}]

    monkeypatch.setattr(bench, "child", child)
    bench.serving([{"gpu": "NVIDIA H100 80GB HBM3"}], {"torch": "x"})
    (written,) = (tmp_path / "r").glob("*-h100-80gb-hbm3-serving.json")
    record = json.loads(written.read_text())
    assert record["adapter"] == {"greedyEqualsPeft": True} and "event" not in record


@pytest.mark.llama_cpp
def test_the_packed_source_holds_what_the_build_reads_and_travels(tmp_path: Path) -> None:
    packed = serving.pack(pinned.sdist(), tmp_path)
    assert packed.stat().st_size < 64 * 2**20
    with tarfile.open(packed) as tar:
        names = tar.getnames()
    # every file under one root, long paths too (they travel in pax headers): the build reads them there
    assert {name.split("/")[0] for name in names} == {"llama.cpp"}
    tops = {name.split("/")[1] for name in names if name.count("/") >= 1}
    assert {"CMakeLists.txt", "ggml", "src", "tools", "common", "vendor", "convert_hf_to_gguf.py", "gguf-py"} <= tops
    assert "llama.cpp/ggml/src/ggml-cuda/template-instances/fattn-vec-instance-f16-f16.cu" in names
    assert "llama.cpp/scripts/ui-assets.cmake" in names  # llama-server's build runs it


@pytest.mark.llama_cpp
@pytest.mark.trainer
@pytest.mark.timeout(1800)
def test_the_phase_runs_on_the_cpu_at_tiny_sizes(tmp_path: Path) -> None:
    spec = {
        "work": str(tmp_path),
        "server": str(pinned.tools() / "llama-server"),
        "converters": str(pinned.converters()),
        "tokens": 8,
        "greedyTokens": 8,
        "concurrency": [1, 2],
        "ctx": 512,
    }
    record = serving.run(spec)
    print(json.dumps({k: record[k] for k in ("adapter", "merged")}))
    assert record["cudaArchitecture"] is None and record["build"]["prebuilt"]
    for form in ("adapter", "merged"):
        assert record[form]["greedyEqualsPeft"], (form, record[form]["greedy"], record["peftGreedy"])
        assert [r["concurrency"] for r in record[form]["runs"]] == [1, 2]
        assert all(r["tokens"] == 8 * r["concurrency"] and r["tokPerS"] > 0 for r in record[form]["runs"])
    assert record["adapter"]["greedy"] == record["merged"]["greedy"]

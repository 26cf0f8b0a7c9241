"""The `serving` phase: llama-server as the serving image builds it, serving a GGUF base with a
LoRA adapter on this machine's GPU, against the merged GGUF, and its greedy tokens against PEFT's.

1. Build `llama-server` from the pinned llama.cpp (the `llama-cpp-python` sdist's vendored tree,
   trimmed by `pack` to what the build and the converters read) with the CMake flags of
   serving_image/Dockerfile, read from the file itself, the CUDA architectures alone set to
   this machine's (the image builds for every GPU product; a P40 is not at hand).
2. A small random-init Llama (the trainer's tiny model at wider sizes) and a LoRA adapter on every
   linear layer of it (PEFT, weights not zero), written as GGUF by llama.cpp's own converters as
   the trainer writes them: the base and the adapter (gguf-lora) and the merged model (gguf).
3. Serve the base with the adapter loaded at scale 0 (the operator's arguments) and, apart, the
   merged GGUF; for 1 and 8 concurrent requests (`--parallel 8`), each generating `tokens`
   greedy tokens, the tokens per second over the whole wall time (and llama-server's own
   generation figure); with the adapter a request names it in its `lora` field.
4. The greedy tokens of the base + adapter and of the merged GGUF on one prompt (token ids in, so
   the comparison is of the weights) against PEFT's on the same ids, fp32, on the GPU.

The record: `<date>-<gpu>-serving.json`. On the CPU (tests/bench/test_serving_phase.py) the same
code runs at tiny sizes with a `server` built elsewhere, so a GPU call meets no untried path.

    python -m bench.serving pack --sdist SDIST --out DIR   # the trimmed source the GPU call carries
    python -m bench.serving run '{"work": ..., "source": ... or "server": ..., ...}'
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "serving_image" / "Dockerfile"
VENDOR = "vendor/llama.cpp"
# What the build reads of the vendored tree (and the converters the trainer runs); the rest (its
# test models, docs, examples, benches) would make the source too large to carry.
KEPT = ("CMakeLists.txt", "cmake", "common", "ggml", "include", "src", "tools", "vendor", "licenses", "LICENSE",
        "convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "conversion", "gguf-py", "build-info.sh",
        "scripts")  # fmt: skip
ARCH_FLAG = "-DCMAKE_CUDA_ARCHITECTURES"
PROMPT = "What sound does a cow make? Give the opposite of the word hot, then repeat the colours red blue."
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def image_build(dockerfile: Path = DOCKERFILE) -> tuple[str, list[str]]:
    """(the pinned llama-cpp-python version, the -D flags of the image's llama.cpp build)."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    version = re.search(r"^ARG LLAMA_CPP_PYTHON_VERSION=(\S+)$", text, re.MULTILINE)
    configure = next(line for line in text.splitlines() if "cmake -S" in line)
    flags = [w.strip('"') for w in configure.split() if w.strip('"').startswith("-D") and "=" in w]
    assert version is not None, f"{dockerfile}: no ARG LLAMA_CPP_PYTHON_VERSION"
    return version.group(1), flags


def machine_flags(flags: list[str], arch: str | None) -> list[str]:
    """The image's flags for this machine: its one CUDA architecture, or without CUDA on a CPU."""
    if arch is None:
        return [f for f in flags if f != "-DGGML_CUDA=ON" and not f.startswith(ARCH_FLAG)]
    return [f"{ARCH_FLAG}={arch}" if f.startswith(ARCH_FLAG) else f for f in flags]


def pack(sdist: Path, out: Path) -> Path:
    """The vendored llama.cpp of the sdist, trimmed to KEPT, as a tarball in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / sdist.name.replace(".tar.gz", "-llama.cpp.tar.gz")
    with tarfile.open(sdist) as source, tarfile.open(target, "w:gz") as packed:
        root = source.getnames()[0].split("/")[0]
        prefix = f"{root}/{VENDOR}/"
        for member in source.getmembers():
            inside = member.name.removeprefix(prefix)
            if member.name.startswith(prefix) and inside.split("/")[0] in KEPT:
                member.name = f"llama.cpp/{inside}"
                # a path over 100 characters travels in the member's pax header, which tarfile
                # writes as it read it: left there, it would put the file back under the old root
                member.pax_headers.pop("path", None)
                packed.addfile(member, source.extractfile(member) if member.isfile() else None)
    return target


def _quiet(command: list[str]) -> None:
    """Run a build step; its output reaches the log only where it fails (the compiler's words)."""
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if done.returncode != 0:
        print("\n".join(done.stdout.splitlines()[-80:]), file=sys.stderr)
        raise subprocess.CalledProcessError(done.returncode, command)


def build(source: Path, work: Path, arch: str | None, jobs: int) -> tuple[Path, dict[str, Any]]:
    """llama-server from the packed source with the image's flags for this machine."""
    started = time.monotonic()
    shutil.rmtree(work / "src", ignore_errors=True)
    with tarfile.open(source) as tar:
        tar.extractall(work / "src", filter="data")
    _, flags = image_build()
    chosen = machine_flags(flags, arch)
    configure = ["cmake", "-S", str(work / "src" / "llama.cpp"), "-B", str(work / "build"), "-G", "Ninja", *chosen]
    _quiet(configure)
    _quiet(["cmake", "--build", str(work / "build"), "--target", "llama-server", "-j", str(jobs)])
    return work / "build" / "bin" / "llama-server", {"flags": chosen, "buildSeconds": round(time.monotonic() - started)}


def make_models(work: Path, sizes: dict[str, int], converters: Path) -> dict[str, Path]:
    """The base, a LoRA adapter (not zero) and the merged model, and their GGUFs as the trainer writes them."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from finetune_trainer.model.tiny_model import make_tiny_model
    from finetune_trainer.outputs.gguf_export import CONVERTERS_ENV, convert_lora, convert_model
    from finetune_trainer.outputs.merge_stream import merge_folder

    os.environ[CONVERTERS_ENV] = str(converters)
    base = make_tiny_model(work / "base", llama_tokenizer=True, **sizes)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    torch.manual_seed(1)
    config = LoraConfig(r=16, lora_alpha=32, target_modules=LORA_TARGETS, init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(str(work / "adapter"))
    merge_folder(base, work / "adapter", work / "merged")
    return {
        "base": base,
        "adapter": work / "adapter",
        "base.gguf": convert_model(base, work / "gguf" / "base-f16.gguf", "f16"),
        "adapter.gguf": convert_lora(work / "adapter", base, work / "gguf" / "adapter-f16.gguf", "f16"),
        "merged.gguf": convert_model(work / "merged", work / "gguf" / "merged-f16.gguf", "f16"),
    }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _call(port: int, path: str, body: dict[str, Any] | None = None, timeout: float = 600) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return dict(json.loads(response.read()))


@contextlib.contextmanager
def serving(server: Path, model: Path, adapter: Path | None, spec: dict[str, Any], log: Path) -> Iterator[int]:
    """llama-server on a free port with the operator's arguments for one adapter; its port once /health says 200."""
    port = _free_port()
    lora = ["--lora-scaled", f"{adapter}:0", "--lora-init-without-apply", "--no-cache-prompt"] if adapter else []
    argv = [str(server), "--model", str(model), *lora, "--host", "127.0.0.1", "--port", str(port),
            "--ctx-size", str(spec["ctx"]), "--parallel", str(max(spec["concurrency"])),
            "--n-gpu-layers", "all" if spec["gpu"] else "0", "--metrics", "--no-webui"]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, f"llama-server exited {proc.returncode}: {log.read_text()[-2000:]}"
            with contextlib.suppress(urllib.error.URLError, OSError):
                if _call(port, "/health", timeout=5).get("status") == "ok":
                    break
            assert time.monotonic() < deadline, "llama-server never answered /health"
            time.sleep(0.5)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def throughput(port: int, concurrency: int, tokens: int, adapter: bool) -> dict[str, Any]:
    """`concurrency` requests at once, each `tokens` greedy tokens (no stop): tokens per second."""
    body: dict[str, Any] = {"prompt": PROMPT, "n_predict": tokens, "temperature": 0, "ignore_eos": True}
    if adapter:
        body["lora"] = [{"id": 0, "scale": 1.0}]
    _call(port, "/completion", {**body, "n_predict": 4})  # warm-up
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        replies = list(pool.map(lambda _: _call(port, "/completion", body), range(concurrency)))
    wall = time.monotonic() - started
    made = sum(int(r.get("tokens_predicted") or 0) for r in replies)
    own = [float(r["timings"]["predicted_per_second"]) for r in replies if r.get("timings")]
    return {
        "concurrency": concurrency,
        "tokens": made,
        "wallSeconds": round(wall, 3),
        "tokPerS": round(made / wall, 1),
        "perRequestTokPerS": round(sum(own) / len(own), 1) if own else None,
    }


def greedy_ids(port: int, ids: list[int], tokens: int, adapter: bool) -> list[int]:
    body: dict[str, Any] = {"prompt": ids, "n_predict": tokens, "temperature": 0, "return_tokens": True}
    if adapter:
        body["lora"] = [{"id": 0, "scale": 1.0}]
    return [int(t) for t in _call(port, "/completion", body)["tokens"]]


def peft_greedy(files: dict[str, Path], tokens: int, gpu: bool) -> tuple[list[int], list[int]]:
    """(the prompt's ids, PEFT's greedy continuation) in fp32, the adapter on."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(files["base"]))
    ids = tokenizer(PROMPT)["input_ids"]
    device = "cuda" if gpu else "cpu"
    model = AutoModelForCausalLM.from_pretrained(str(files["base"]), dtype=torch.float32).to(device)
    peft = PeftModel.from_pretrained(model, str(files["adapter"])).eval()
    with torch.no_grad():
        out = peft.generate(torch.tensor([ids], device=device), max_new_tokens=tokens, do_sample=False,
                            eos_token_id=tokenizer.eos_token_id)  # fmt: skip
    new = [int(t) for t in out[0][len(ids) :]]
    return ids, [t for t in new if t != tokenizer.eos_token_id]


def _gpu_arch() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}{minor}"


def measure(spec: dict[str, Any], server: Path, files: dict[str, Path], logs: Path) -> dict[str, Any]:
    """Throughput with the adapter and merged, and the greedy comparison, on one server each."""
    ids, expected = peft_greedy(files, spec["greedyTokens"], spec["gpu"])
    out: dict[str, Any] = {"peftGreedy": expected}
    for label, model, adapter in (("adapter", files["base.gguf"], files["adapter.gguf"]),
                                  ("merged", files["merged.gguf"], None)):  # fmt: skip
        with serving(server, model, adapter, spec, logs / f"llama-server-{label}.log") as port:
            runs = [throughput(port, c, spec["tokens"], adapter is not None) for c in spec["concurrency"]]
            got = greedy_ids(port, ids, spec["greedyTokens"], adapter is not None)
        out[label] = {"runs": runs, "greedy": got, "greedyEqualsPeft": got == expected}
    return out


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """The phase: build (or take `server`), make the models, measure; the record's body."""
    work = Path(spec["work"])
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    arch = _gpu_arch()
    spec = {"tokens": 128, "greedyTokens": 16, "concurrency": [1, 8], "ctx": 8 * 512, **spec, "gpu": arch is not None}
    version, _ = image_build()
    if spec.get("server"):
        server, built = Path(spec["server"]), {"flags": None, "buildSeconds": None, "prebuilt": spec["server"]}
    else:
        server, built = build(Path(spec["source"]), work, arch, int(spec.get("jobs") or os.cpu_count() or 2))
    converters = Path(spec.get("converters") or work / "src" / "llama.cpp")
    started = time.monotonic()
    files = make_models(work / "models", spec.get("sizes") or {}, converters)
    made_s = round(time.monotonic() - started)
    measured = measure(spec, server, files, logs)
    sizes = {k: files[k].stat().st_size for k in ("base.gguf", "adapter.gguf", "merged.gguf")}
    return {
        "phase": "serving",
        "llamaCppPython": version,
        "cudaArchitecture": arch,
        "build": built,
        "model": {
            "sizes": spec.get("sizes") or {},
            "ggufBytes": sizes,
            "loraTargets": LORA_TARGETS,
            "rank": 16,
            "makeSeconds": made_s,
        },
        "tokensPerRequest": spec["tokens"],
        **measured,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.serving", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="trim the pinned sdist to what the build reads")
    packing.add_argument("--sdist", type=Path, required=True)
    packing.add_argument("--out", type=Path, required=True)
    running = commands.add_parser("run", help="the phase, its record's body as one JSON line")
    running.add_argument("spec")
    args = parser.parse_args(argv)
    if args.command == "pack":
        target = pack(args.sdist, args.out)
        print(f"{target} ({target.stat().st_size / 2**20:.1f} MiB)")
        return 0
    print(json.dumps({"event": "bench-serving", **run(json.loads(args.spec))}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

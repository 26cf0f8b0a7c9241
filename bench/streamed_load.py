"""fsdp's streamed loader against the loader before it, on one model: bit for bit, memory, bytes, time.

One process per GPU (gloo on the CPU when `gpus` is 0: two processes), each through the
trainer's own `load_model` and `Fsdp.wrap`:
1. streamed: the meta model, each tensor read by its owner rank, quantised, broadcast, sharded
   by FSDP unit by unit; its anonymous host peak, the seconds it took and the bytes it read;
2. as fsdp loaded before (`streams = False`): the whole packed model on the host; its seconds
   and anonymous host peak (the process's peak since its start, so at least the first's);
3. every parameter (the adapter's initial weights too), buffer, packed 4-bit weight and every
   tensor and field of its quantisation state compared, one at a time (the streamed model's
   full weights gathered by `summon_full_params`).

    python -m bench.streamed_load '{"path": SLICE, "gpus": 1, "work": DIR}'

(`"quantization": "none"` loads the base unquantised: the same ownership and broadcast, no 4-bit
weight.)

prints one `bench-summary` line: per rank the differences (names; [] when identical), the
bytes read (their sum against the checkpoint's tensor bytes), the anonymous host peaks and the
load seconds. `tests/trainer/test_streamed_load.py` runs it on the tiny model.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.trainer_job import spec_for

REPO = Path(__file__).resolve().parent.parent


def _config(model_dir: Path, gpus: int, quantization: str) -> Any:
    from finetune_api.trainer_config import TrainerConfig

    spec = spec_for(seq=128, steps=1, gpus=gpus, parallelism="fsdp")
    spec["resources"].pop("gpuProduct")
    spec["quantization"] = {"type": quantization}
    paths = {"model": str(model_dir), "dataset": str(model_dir / "unused.jsonl"), "output": str(model_dir / "unused")}
    return TrainerConfig.model_validate({"jobName": "streamed-load", "namespace": None, "spec": spec, "paths": paths})


def _bytes(value: Any) -> Any:
    """A tensor as its dtype, shape and bytes on the host (equal only when bit for bit equal)."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    flat = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return ("tensor", value.dtype, tuple(value.shape), flat)


def _same(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        x, y = _bytes(a), _bytes(b)
        return bool(x[:3] == y[:3] and torch.equal(x[3], y[3]))
    return bool(a == b)


def _state(state: Any) -> dict[str, Any]:
    """A quantisation state's tensors and fields, the nested state's as `state2.*`."""
    out: dict[str, Any] = {}
    for name, value in vars(state).items():
        if name == "state2" and value is not None:
            out.update({f"state2.{k}": v for k, v in _state(value).items()})
        else:
            out[name] = value
    return out


def _entries(model: Any) -> dict[str, Any]:
    """Every parameter and buffer by name, every 4-bit module's state field by name (no copy)."""
    out: dict[str, Any] = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        out[name.replace("_fsdp_wrapped_module.", "")] = tensor
    for name, module in model.named_modules():
        state = getattr(module, "quant_state", None)
        if state is not None:
            for key, value in _state(state).items():
                out[f"{name.replace('_fsdp_wrapped_module.', '')}.quant_state.{key}"] = value
    return out


def _differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    wrong = sorted(set(ours) ^ set(theirs))
    return wrong + [name for name in sorted(set(ours) & set(theirs)) if not _same(ours[name], theirs[name])]


def _load(config: Any, hardware: Any, mode: Any, device: Any) -> Any:
    from finetune_trainer.memory.budget import MemoryPlan
    from finetune_trainer.model import families
    from finetune_trainer.model.loading import load_model, load_model_config

    # sdpa, or the kernel the family needs (Gemma 2: eager), as the trainer chooses.
    attention = families.kernel(families.check(load_model_config(config), config.spec), "sdpa")
    plan = MemoryPlan(None, "cpu", {})
    return load_model(config, hardware, "fp32", attention, plan, mode=mode, device=device, seed=0)


def _warm(config: Any) -> None:
    """Import what both loaders import on first use (transformers' model class, PEFT,
    bitsandbytes), so neither's seconds include it."""
    import bitsandbytes  # noqa: F401
    import peft  # noqa: F401
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from finetune_trainer.model.loading import load_model_config

    MODEL_FOR_CAUSAL_LM_MAPPING[type(load_model_config(config))]


def worker(model_dir: Path, out: Path, gpu: bool, quantization: str) -> None:
    """One rank: the model streamed and wrapped, then as before, compared."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel

    from finetune_trainer.distributed.topology import Topology
    from finetune_trainer.hardware.capabilities import detect
    from finetune_trainer.hardware.host_memory import HostMemory
    from finetune_trainer.modes import Fsdp

    class BeforeStreaming(Fsdp):
        streams = False

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", rank) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world)
    config = _config(model_dir, 1 if gpu else 0, quantization)
    hardware, memory = detect(config.spec), HostMemory(interval=0.02).start()
    _warm(config)
    at_start = memory.anon_peak_gib  # the process with its libraries, before any weight
    start, streamed = time.time(), Fsdp()
    model = _load(config, hardware, streamed, device)
    built = time.time() - start  # the meta model with its adapter: no weight read yet
    trainable = [p for p in model.parameters() if p.requires_grad]
    topology = Topology(rank=rank, world_size=world, local_rank=rank, local_world_size=world)
    wrapped = streamed.wrap(model, trainable, topology, gpu)
    result: dict[str, Any] = {"rank": rank, "streamedSeconds": round(time.time() - start, 1)}
    result.update(metaModelSeconds=round(built, 1), anonAtStartGiB=round(at_start, 2))
    result.update(bytesRead=streamed.bytes_read, streamedAnonPeakGiB=round(memory.anon_peak_gib, 2))
    start = time.time()
    before = _load(config, hardware, BeforeStreaming(), device)
    result.update(beforeSeconds=round(time.time() - start, 1), beforeAnonPeakGiB=round(memory.anon_peak_gib, 2))
    with FullyShardedDataParallel.summon_full_params(wrapped):
        ours = _entries(wrapped)
        result.update(compared=len(ours), differences=_differences(ours, _entries(before)))
    memory.stop()
    out.write_text(json.dumps(result), encoding="utf-8")
    dist.barrier()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tensor_bytes(model_dir: Path) -> tuple[int, int]:
    """The checkpoint's tensor bytes and its largest tensor's element count, from the headers."""
    import torch
    from safetensors import safe_open

    from finetune_trainer.modes.checkpoint_files import DTYPES, files_of

    total, largest = 0, 0
    for path in files_of(model_dir):
        with safe_open(str(path), framework="pt") as handle:
            stored: list[str] = handle.keys()
            for key in stored:
                piece = handle.get_slice(key)
                count = torch.Size(piece.get_shape()).numel()
                total += count * DTYPES[piece.get_dtype()].itemsize
                largest = max(largest, count)
    return total, largest


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Every rank of one comparison, as children; their results and the checkpoint's bytes."""
    gpus, work, model_dir = int(spec.get("gpus", 0)), Path(spec["work"]), Path(spec["path"])
    work.mkdir(parents=True, exist_ok=True)
    world, port = gpus or 2, str(_free_port())
    started = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1"}
        env.update(MASTER_PORT=port, OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
        argv = [sys.executable, "-m", "bench.streamed_load", "--worker", str(model_dir), str(work / f"{rank}.json")]
        argv += [spec.get("quantization", "nf4"), *(["--gpu"] if gpus else [])]
        started.append(subprocess.Popen(argv, env=env, cwd=REPO, stderr=subprocess.PIPE, text=True))
    errors = [p.communicate(timeout=spec.get("timeout_s", 1200))[1] for p in started]
    codes = [p.returncode for p in started]
    ranks = [json.loads((work / f"{r}.json").read_text()) for r in range(world) if codes[r] == 0]
    failed = {r: errors[r][-2000:] for r in range(world) if codes[r] != 0}
    total, largest = tensor_bytes(model_dir)
    # Issue 30's target: a process's own memory at most the largest tensor in fp32 plus 2 GiB
    # over what it held before loading.
    bound = largest * 4 / 2**30 + 2
    for rank in ranks:
        rank["streamedWithinBound"] = rank["streamedAnonPeakGiB"] - rank["anonAtStartGiB"] <= bound
    summary = {"world": world, "checkpointTensorBytes": total, "boundOverStartGiB": round(bound, 2)}
    return {**summary, "ranks": ranks, "failed": failed}


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(Path(sys.argv[2]), Path(sys.argv[3]), "--gpu" in sys.argv[5:], sys.argv[4])
    else:
        print(json.dumps({"event": "bench-summary", **run(json.loads(sys.argv[1]))}), flush=True)

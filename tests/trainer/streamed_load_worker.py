"""One rank of `test_streamed_load`: today's fsdp loader and the streamed one, compared bit for bit.

Run by the test as `python -m tests.trainer.streamed_load_worker MODEL_DIR OUT_JSON` with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (gloo, on the CPU), or on a GPU machine with
`--gpu` (NCCL, each rank on its GPU; quantised by bitsandbytes' CUDA kernel). Each rank loads the
model both ways through the trainer's own `load_model` and `Fsdp.wrap`, gathers the full weights
of the sharded model (`summon_full_params`) and writes what differs from today's loader: the
packed 4-bit data, every quantisation-state tensor and field, the other weights and buffers.
It also writes the bytes it read from the checkpoint and its anonymous memory before and after.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from finetune_api.resource import FineTuneJob
from finetune_api.trainer_config import TrainerConfig
from finetune_cli.run_local import local_paths
from finetune_trainer.distributed.topology import Topology
from finetune_trainer.hardware import detect
from finetune_trainer.host_memory import HostMemory, _anon_kib
from finetune_trainer.model_loading import load_model
from finetune_trainer.modes import Fsdp
from finetune_trainer.preflight import MemoryPlan
from tests.trainer.conftest import BASE_JOB, _merge


class TodaysFsdp(Fsdp):
    """fsdp as it loaded before streaming: the whole packed model on the host in each process."""

    streams = False


def _config(model_dir: Path, gpu: bool) -> TrainerConfig:
    spec: dict[str, Any] = {"model": {"source": {"pvc": {"claimName": "models", "path": model_dir.name}}}}
    if gpu:
        spec["resources"] = {"gpus": 1}
    job = FineTuneJob.model_validate(_merge(BASE_JOB, {"spec": spec}))
    return TrainerConfig(job_name="tiny", namespace=None, spec=job.spec, paths=local_paths("tiny", job.spec, model_dir.parent.parent))


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, with its dtype and shape: equal only when bit for bit equal."""
    flat = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return torch.cat([flat, torch.tensor(list(str((tensor.dtype, tuple(tensor.shape))).encode()), dtype=torch.uint8)])


def _state(tensor: Any) -> dict[str, Any]:
    """A quantisation state's tensors (as bytes on the host) and fields, nested state included."""
    out: dict[str, Any] = {}
    for name, value in vars(tensor).items():
        if isinstance(value, torch.Tensor):
            out[name] = _bytes(value)
        elif name == "state2" and value is not None:
            out.update({f"state2.{k}": v for k, v in _state(value).items()})
        else:
            out[name] = value
    return out


def _weights(model: torch.nn.Module) -> dict[str, Any]:
    """Every parameter (the adapter's too) and buffer, and every 4-bit module's state, by name."""
    out: dict[str, Any] = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        out[name.replace("_fsdp_wrapped_module.", "")] = _bytes(tensor)
    for name, module in model.named_modules():
        state = getattr(module, "quant_state", None)
        if state is not None:
            out[name.replace("_fsdp_wrapped_module.", "") + ".quant_state"] = _state(state)
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and torch.equal(a, b)
    return bool(a == b)


def _differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    wrong = sorted(set(ours) ^ set(theirs))
    for name in sorted(set(ours) & set(theirs)):
        a, b = ours[name], theirs[name]
        if isinstance(a, dict):
            wrong += [f"{name}.{key}" for key in sorted(set(a) | set(b)) if not _same(a.get(key), b.get(key))]
        elif not _same(a, b):
            wrong.append(name)
    return wrong


def main(model_dir: Path, out: Path, gpu: bool) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    topology = Topology(rank=rank, world_size=world, local_rank=rank, local_world_size=world)
    device = torch.device("cuda", rank) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world, device_id=device if gpu else None)
    config, plan = _config(model_dir, gpu), MemoryPlan(None, "cpu", {})
    hardware = detect(config.spec)
    memory = HostMemory(interval=0.01).start()
    before = _anon_kib() / 2**20
    streamed = Fsdp()
    model = load_model(config, hardware, "fp32", "sdpa", plan, mode=streamed, device=device, seed=0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    wrapped = streamed.wrap(model, trainable, topology, gpu)
    peak = memory.anon_peak_gib
    from torch.distributed.fsdp import FullyShardedDataParallel

    with FullyShardedDataParallel.summon_full_params(wrapped):
        ours = _weights(wrapped)
    today = load_model(config, hardware, "fp32", "sdpa", plan, mode=TodaysFsdp(), device=device, seed=0)
    result = {
        "differences": _differences(ours, _weights(today)),
        "compared": len(ours),
        "bytesRead": streamed.bytes_read,
        "anonBeforeGiB": before,
        "anonPeakStreamedGiB": peak,
        "anonPeakTodayGiB": memory.anon_peak_gib,
    }
    memory.stop()
    out.write_text(json.dumps(result), encoding="utf-8")
    dist.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), "--gpu" in sys.argv[3:])

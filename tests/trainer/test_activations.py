"""Where activations live changes memory, not the result: the tiny model trained with some layers
keeping their activations (gradientCheckpointing auto), and with the others offloaded, ends on the
adapter of the run that checkpoints every layer; and the offload hooks give autograd back what it
saved. (On the CPU no plan sizes `auto`: test_hooks.KEEP_LAYERS names the layers kept.)"""

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from finetune_trainer.activations import MIN_OFFLOAD_BYTES, Offload
from tests.support.training import ADAPTER_TOLERANCE, max_difference

from .conftest import JobDir, make_job_dir

pytestmark = pytest.mark.trainer

STEPS = 6
# LoRA dropout on: a recomputed layer must draw the masks its first forward drew.
SPEC = {"training": {"maxSteps": STEPS, "batchSize": 2}, "checkpoints": {"everySteps": STEPS}}


def _adapter(job: JobDir) -> dict:
    from safetensors.torch import load_file

    return load_file(str(job.output / "adapter" / "adapter_model.safetensors"))


def _job(tmp_path: Path, tiny_assets: Path, name: str, training: dict, extra: dict | None = None) -> JobDir:
    (tmp_path / name).mkdir()
    job = make_job_dir(tmp_path / name, tiny_assets)
    job.spec_changes = {**SPEC, "training": {**SPEC["training"], **training}, **(extra or {})}
    return job


def _counts(stderr: str) -> dict[str, int]:
    found = re.findall(
        r"activations: \{'layers': (\d+), 'kept': (\d+), 'recomputed': (\d+), 'offloaded': (\d+)\}", stderr
    )
    assert found, stderr[-2000:]
    layers, kept, recomputed, offloaded = map(int, found[-1])
    return {"layers": layers, "kept": kept, "recomputed": recomputed, "offloaded": offloaded}


def test_keeping_and_offloading_layers_trains_the_all_checkpointed_adapter(tmp_path: Path, tiny_assets: Path) -> None:
    steady = _job(tmp_path, tiny_assets, "all", {"gradientCheckpointing": True})
    done = steady.run()
    assert done.code == 0, done.stderr[-3000:]
    assert _counts(done.stderr) == {"layers": 2, "kept": 0, "recomputed": 2, "offloaded": 0}

    mixed = _job(tmp_path, tiny_assets, "auto", {"gradientCheckpointing": "auto", "activationOffload": False})
    done = mixed.run(env={"FINETUNE_TEST_KEEP_LAYERS": "1"})
    assert done.code == 0, done.stderr[-3000:]
    assert _counts(done.stderr) == {"layers": 2, "kept": 1, "recomputed": 1, "offloaded": 0}
    assert max_difference(_adapter(mixed), _adapter(steady)) <= ADAPTER_TOLERANCE

    offloaded = _job(tmp_path, tiny_assets, "offload", {"gradientCheckpointing": "auto", "activationOffload": True})
    done = offloaded.run(env={"FINETUNE_TEST_KEEP_LAYERS": "1"})
    assert done.code == 0, done.stderr[-3000:]
    assert _counts(done.stderr) == {"layers": 2, "kept": 1, "recomputed": 0, "offloaded": 1}
    assert max_difference(_adapter(offloaded), _adapter(steady)) <= ADAPTER_TOLERANCE


def test_two_fsdp_processes_keep_a_layer_and_train_the_all_checkpointed_adapter(
    tmp_path: Path, tiny_assets: Path
) -> None:
    two = {"resources": {"gpus": 0, "cpu": "2", "processes": 2}}
    fsdp = {"parallelism": "fsdp"}
    steady = _job(tmp_path, tiny_assets, "all", {**fsdp, "gradientCheckpointing": True}, two)
    assert steady.run().code == 0
    mixed = _job(tmp_path, tiny_assets, "auto", {**fsdp, "gradientCheckpointing": "auto"}, two)
    done = mixed.run(env={"FINETUNE_TEST_KEEP_LAYERS": "1"})
    assert done.code == 0, done.stderr[-3000:]
    assert _counts(done.stderr)["kept"] == 1
    assert max_difference(_adapter(mixed), _adapter(steady)) <= ADAPTER_TOLERANCE


def test_the_offload_hooks_hand_autograd_back_what_it_saved() -> None:
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(256, 512), nn.SiLU(), nn.Linear(512, 256))
    x = torch.randn(64, 256, requires_grad=True)
    packed: list[object] = []

    def pack(tensor: torch.Tensor) -> object:
        out = Offload.pack(tensor)
        packed.append(out)
        return out

    def grads(hooked: bool) -> list[torch.Tensor]:
        layer.zero_grad()
        x.grad = None
        if hooked:
            with torch.autograd.graph.saved_tensors_hooks(pack, Offload.unpack):
                y = layer(x)
        else:
            y = layer(x)
        (y.square().sum()).backward()
        assert x.grad is not None
        return [x.grad.clone(), *(p.grad.clone() for p in layer.parameters() if p.grad is not None)]

    plain, hooked = grads(False), grads(True)
    # The activations large enough went through a copy; parameters and small tensors did not.
    copied = [p for p in packed if isinstance(p, tuple)]
    assert copied and all(p[0].numel() * p[0].element_size() >= MIN_OFFLOAD_BYTES for p in copied)
    assert not any(isinstance(p, nn.Parameter) for p in packed if isinstance(p, tuple))
    assert all(torch.equal(a, b) for a, b in zip(plain, hooked, strict=True))

"""The trainer's modes: one module each, one registry keyed by the API's words, and the launch
decision handed from the launcher to its workers whole."""

import pickle
from types import SimpleNamespace

import pytest
import torch

from finetune_api import modes as words
from finetune_api import parse_file
from finetune_plan import choose
from finetune_trainer.hardware.capabilities import Gpu, Hardware
from finetune_trainer.memory.budget import MemoryPlan
from finetune_trainer.modes import REGISTRY, DataParallel, DeviceMap, Fsdp, SingleProcess, for_run
from finetune_trainer.training.launch_plan import Decision, probe_attention
from tests.planning.models import EXAMPLE, LLAMA_33_70B

CPU = Hardware(gpus=())
TWO_GPUS = Hardware(gpus=(Gpu(0, "Tesla P40", (6, 1), 24 << 30), Gpu(1, "Tesla P40", (6, 1), 24 << 30)))
PLACED = MemoryPlan(None, "planner", {}, device_map={"model.layers.0": 0})


def test_the_registry_has_a_mode_for_every_word_of_the_api() -> None:
    assert sorted(REGISTRY) == sorted(m.spec for m in words.MODES)


def test_a_world_of_one_trains_as_the_single_process_unless_the_mode_is_one_process() -> None:
    assert type(for_run("fsdp", 1)) is SingleProcess
    assert type(for_run("dataParallel", 1)) is SingleProcess
    assert type(for_run("deviceMap", 1)) is DeviceMap
    assert type(for_run("fsdp", 2)) is Fsdp
    assert type(for_run("dataParallel", 2)) is DataParallel


def test_each_mode_places_the_model_its_own_way() -> None:
    cuda1 = torch.device("cuda", 1)
    assert DataParallel().device_map(TWO_GPUS, PLACED, cuda1) == {"": 1}
    assert Fsdp().device_map(TWO_GPUS, PLACED, cuda1) == {"": "cpu"}
    assert DeviceMap().device_map(TWO_GPUS, PLACED, cuda1) == {"model.layers.0": 0}
    assert all(m.device_map(CPU, PLACED, torch.device("cpu")) == {"": "cpu"} for m in (DataParallel(), Fsdp()))
    assert Fsdp().quant_storage == torch.float32 and SingleProcess().quant_storage == torch.uint8
    assert Fsdp().quantise_on(TWO_GPUS, cuda1) == cuda1
    assert DataParallel().quantise_on(TWO_GPUS, cuda1) == torch.device("cpu")
    assert DeviceMap().memory_cap_device(cuda1) is None and DataParallel().memory_cap_device(cuda1) == 1
    assert DeviceMap().loop_device(cuda1) == torch.device("cpu")
    assert Fsdp().sharded and not DataParallel().sharded


def test_a_gpu_decision_survives_the_trip_to_the_workers() -> None:
    job = parse_file(EXAMPLE)[0].job
    assert job is not None
    launch = choose(job.spec, LLAMA_33_70B, 4, attention="memory_efficient")
    decision = Decision(launch, "sdpa_expanded")
    received = pickle.loads(pickle.dumps(decision))
    assert received == decision
    assert received.loss_chunk_tokens == (launch.plan.recipe.loss_chunk_tokens if launch.plan else 0)


def test_on_gpus_the_attention_probe_runs_in_a_child_and_its_answer_comes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher keeps off the GPUs: the probe's child answers (forced here, no GPU needed)."""
    shape = SimpleNamespace(hidden_size=64, num_attention_heads=4, head_dim=None)
    for forced in ("sdpa_expanded", "sdpa", "eager"):
        monkeypatch.setenv("FINETUNE_ATTENTION", forced)
        assert probe_attention(TWO_GPUS, shape, "fp32") == forced

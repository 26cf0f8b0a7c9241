"""Decisions made from the hardware: precision, CPU threads, which GPUs the torch build can run."""

import pytest

from finetune_api.reasons import ExitReason
from finetune_trainer.failures import TrainerFailure
from finetune_trainer.hardware.capabilities import Gpu, Hardware, cpu_threads, resolve_precision
from finetune_trainer.hardware.self_check import _runnable

P40 = Gpu(0, "Tesla P40", (6, 1), 24 * 2**30)
A100 = Gpu(0, "NVIDIA A100", (8, 0), 80 * 2**30)
CPU = Hardware(gpus=())


def test_auto_is_fp32_on_pascal_and_the_cpu_bf16_on_ampere() -> None:
    assert resolve_precision("auto", Hardware((P40,))) == "fp32"
    assert resolve_precision("auto", CPU) == "fp32"
    assert resolve_precision("auto", Hardware((A100,))) == "bf16"
    # one Pascal card in the mix decides for all of them
    assert resolve_precision("auto", Hardware((A100, Gpu(1, "Tesla P40", (6, 1), 0)))) == "fp32"


@pytest.mark.parametrize(
    ("requested", "hardware"), [("bf16", Hardware((P40,))), ("fp16", Hardware((P40,))), ("bf16", CPU)]
)
def test_half_precision_is_refused_where_it_breaks(requested: str, hardware: Hardware) -> None:
    with pytest.raises(TrainerFailure) as caught:
        resolve_precision(requested, hardware)
    assert caught.value.reason == ExitReason.UnsupportedHardware
    assert "spec.precision" in caught.value.message


def test_cpu_threads_follow_the_pod_limit_not_the_node() -> None:
    assert cpu_threads("1", available=64) == 1
    assert cpu_threads("2500m", available=64) == 2
    assert cpu_threads("500m", available=64) == 1
    assert cpu_threads("16", available=8) == 8
    assert cpu_threads(None, available=8) == 8


def test_torch_arch_list_decides_which_gpus_can_run() -> None:
    cu118 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "compute_90"]
    assert _runnable((6, 1), cu118)  # sm_60 code runs on sm_61
    assert not _runnable((6, 1), ["sm_75", "sm_80", "sm_90"])  # torch 2.8-style build: no Pascal
    assert _runnable((9, 0), ["sm_80", "compute_80"])  # PTX JIT for newer cards

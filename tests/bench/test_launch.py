"""Mode choice and the torchrun command of the data-parallel mode."""

import pytest

from finetune_trainer.distributed.launch import choose_mode, torchrun_argv


@pytest.mark.parametrize(
    ("gpus", "fits", "mode"),
    [(1, True, "single"), (2, True, "data_parallel"), (4, True, "data_parallel"), (4, False, "device_map")],
)
def test_data_parallel_only_when_one_gpu_holds_the_job(gpus: int, fits: bool, mode: str) -> None:
    assert choose_mode(gpus, fits) == mode


def test_torchrun_starts_one_process_per_gpu_on_this_node() -> None:
    argv = torchrun_argv("/etc/finetune/config.json", 4)
    assert argv[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", "-m"]
    assert argv[-3:] == ["finetune_trainer", "--config", "/etc/finetune/config.json"]
    with pytest.raises(ValueError, match="at least 2 GPUs"):
        torchrun_argv("/x", 1)

"""The trainer's pre-flight call: WontFit with the numbers before any weight loads, else the
budget the trainer loads with."""

from types import SimpleNamespace

import pytest

from finetune_api import parse_file
from finetune_api.reasons import ExitReason
from finetune_api.trainer_config import RuntimePaths, TrainerConfig
from finetune_trainer.failures import TrainerFailure
from finetune_trainer.planning import GIB, trainer_preflight

from .models import EXAMPLE, LLAMA_3_8B, LLAMA_33_70B


def config() -> TrainerConfig:
    job = parse_file(EXAMPLE)[0].job
    assert job is not None
    paths = RuntimePaths(model="/mnt/model", dataset="/mnt/dataset/data.jsonl", output="/mnt/output/x")
    return TrainerConfig(job_name="x", namespace="default", spec=job.spec, paths=paths)


def p40s(count: int) -> SimpleNamespace:
    """What the trainer's hardware detection reports: name and total bytes per GPU."""
    return SimpleNamespace(gpus=[SimpleNamespace(name="Tesla P40", total_bytes=int(22.4 * GIB))] * count)


def test_70b_on_two_p40s_fails_with_wont_fit_and_the_numbers():
    with pytest.raises(TrainerFailure) as failure:
        trainer_preflight(config(), p40s(2), LLAMA_33_70B)
    assert failure.value.reason == ExitReason.WontFit
    assert "GiB more than its 22.4 GiB" in failure.value.message
    assert "fits on 3 x Tesla-P40" in failure.value.message


def test_70b_on_four_p40s_gets_a_device_map_and_budget():
    plan = trainer_preflight(config(), p40s(4), LLAMA_33_70B)
    assert plan.fits and plan.mode == "device_map"
    assert plan.max_memory is not None and sorted(plan.max_memory) == [0, 1, 2, 3]
    assert all(0 < budget < 22.4 * GIB for budget in plan.max_memory.values())
    assert plan.device_map is not None and plan.device_map["lm_head"] == 3
    assert plan.summary["per_gpu_total_gib"]["cuda:3"] < 22.4
    assert plan.recipe.loss_chunk_tokens == 0  # the trainer computes the loss in one piece


def test_8b_on_one_p40_fits_and_accepts_a_transformers_style_config():
    class PretrainedConfigLike:
        def to_dict(self) -> dict[str, object]:
            return dict(LLAMA_3_8B)

    plan = trainer_preflight(config(), p40s(1), PretrainedConfigLike())
    assert plan.fits and plan.device_map is None
    assert plan.max_memory is not None and list(plan.max_memory) == [0]


def test_an_unreadable_model_config_is_invalid_config():
    with pytest.raises(TrainerFailure) as failure:
        trainer_preflight(config(), p40s(1), {"hidden_size": 8})
    assert failure.value.reason == ExitReason.InvalidConfig
    assert "num_attention_heads" in failure.value.message

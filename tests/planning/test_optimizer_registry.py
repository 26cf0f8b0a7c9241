"""An optimizer is one registry entry: a throwaway one, registered by a module of its own, is a
choice of the spec and the CRD, and the planner sizes its state from the entry; the trainer's
factory is the function the entry names. The built-in entries keep the planner's figures."""

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from finetune_api import crd
from finetune_api.optimizers import OPTIMIZERS
from finetune_api.spec import TrainingSpec
from finetune_plan import shape_from_config
from finetune_plan.grace import checkpoint_bytes
from finetune_plan.memory import FP32, Recipe, lora_state_bytes_per_layer
from tests.planning.models import LLAMA_3_8B

SHAPE = shape_from_config(LLAMA_3_8B)
MODULE = "throwaway_optimizer"
SOURCE = """from finetune_api.optimizers import Optimizer, register

register(Optimizer("heavy_adam", 16.0, "throwaway_optimizer:make", "a test's throwaway", order=99))


def make(training, groups):
    raise NotImplementedError
"""


@pytest.fixture
def heavy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    (tmp_path / f"{MODULE}.py").write_text(SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__(MODULE)
    try:
        yield
    finally:
        OPTIMIZERS.unregister("heavy_adam")
        sys.modules.pop(MODULE, None)


def test_the_built_in_entries_keep_the_planner_figures() -> None:
    assert {o.name: o.state_bytes_per_param for o in OPTIMIZERS} == {
        "paged_adamw_8bit": 2 + 2 * FP32 / 256,
        "paged_adamw_32bit": 2 * FP32,
        "adamw_8bit": 2 + 2 * FP32 / 256,
        "adamw_torch": 2 * FP32,
        "adafactor": 0.5,
        "sgd": 0.0,
    }
    assert all(o.factory.startswith("finetune_trainer.training.optim:") for o in OPTIMIZERS)


def test_a_throwaway_optimizer_is_one_module(heavy: None) -> None:
    assert TrainingSpec(optimizer="heavy_adam").optimizer == "heavy_adam"
    training = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "training"
    ]
    assert training["properties"]["optimizer"]["enum"][-1] == "heavy_adam"
    sgd = lora_state_bytes_per_layer(SHAPE, Recipe(optimizer="sgd"))
    heavy_state = lora_state_bytes_per_layer(SHAPE, Recipe(optimizer="heavy_adam"))
    params = SHAPE.lora_params_per_layer(8, Recipe().lora_targets)
    assert heavy_state - sgd == pytest.approx(16.0 * params)
    assert checkpoint_bytes(1000, "heavy_adam") == 1000 * (2 * FP32 + 16)


def test_an_unregistered_optimizer_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="Input should be 'paged_adamw_8bit', "):
        TrainingSpec(optimizer="heavy_adam")

"""adapter_config.json names the base model by its public name (vLLM's resolver matches on it),
never the folder the pod loaded the model from."""

import json
from pathlib import Path

import pytest

from finetune_api.trainer_config import TrainerConfig
from finetune_trainer.outputs.export import name_base, public_name
from tests.support.specs import body


def _config(model: dict[str, object], path: str) -> TrainerConfig:
    spec = body(model=model)
    return TrainerConfig.model_validate(
        {"jobName": "tiny", "spec": spec, "paths": {"model": path, "dataset": "d", "output": "o"}}
    )


def _folder(tmp_path: Path, carried: str | None) -> str:
    folder = tmp_path / "model"
    folder.mkdir()
    config = {"model_type": "llama", **({"_name_or_path": carried} if carried is not None else {})}
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_a_hub_model_is_named_by_its_id() -> None:
    assert public_name(_config({"source": {"hub": {"id": "org/tiny"}}}, "org/tiny")) == "org/tiny"


@pytest.mark.parametrize(
    ("name", "carried", "expected"),
    [
        ("meta-llama/Llama-3.2-1B", "/some/folder", "meta-llama/Llama-3.2-1B"),  # spec.model.name first
        (None, "Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B"),  # the name the checkpoint carries
        (None, "/home/me/llama", None),  # a folder is no public name: the pod's folder then
        (None, None, None),
    ],
)
def test_a_pvc_model_is_named_by_spec_model_name_else_its_config(
    tmp_path: Path, name: str | None, carried: str | None, expected: str | None
) -> None:
    folder = _folder(tmp_path, carried)
    model: dict[str, object] = {"source": {"pvc": {"claimName": "models", "path": "m"}}}
    if name is not None:
        model["name"] = name
    assert public_name(_config(model, folder)) == (expected or folder)


def test_the_saved_adapter_config_names_the_base(tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/mnt/model/x", "r": 8}))
    name_base(tmp_path, "org/tiny")
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    assert saved == {"base_model_name_or_path": "org/tiny", "r": 8}

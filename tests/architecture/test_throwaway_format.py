"""An output format is one module: a throwaway one (`tarball`, the adapter folder as one .tar),
registered from a module of its own through FINETUNE_PLUGINS, reaches every part with nothing
else changed: the spec accepts it, the CRD's enum and the API reference list it, the operator's
status gives its file and serve command, the pre-flight runs its check, and the trainer's export
writes it from a real saved adapter."""

from __future__ import annotations

import sys
import tarfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from finetune_api import crd, reference
from finetune_api.formats import FORMATS
from finetune_api.registry import PLUGINS_ENV, load_plugins
from finetune_api.spec import FineTuneJobSpec
from finetune_api.trainer_config import RuntimePaths, TrainerConfig
from finetune_operator.builders.serving import output_status
from tests.support.specs import body

MODULE = "throwaway_tarball_format"
SOURCE = '''
"""A throwaway output format: the adapter folder as one .tar (its files, serve, exporter and check)."""

import os
import tarfile
from pathlib import Path

from finetune_api.formats import FormatError, OutputFormat, Where, register

REFUSE = "THROWAWAY_TARBALL_REFUSE"


def files(where: Where) -> dict[str, str]:
    return {"path": f"{where.out}/adapter.tar"}


def serve(where: Where, written: dict[str, str]) -> str:
    unpack = f"tar -xf {written['path']}"
    return f"{unpack} && vllm serve {where.base_model} --enable-lora --lora-modules {where.job}=adapter"


def export(export) -> Path:
    target = export.output / "adapter.tar"
    with tarfile.open(target, "w") as tar:
        tar.add(export.adapter, arcname="adapter")
    return target


def check(config) -> None:
    if os.environ.get(REFUSE):
        raise FormatError(os.environ[REFUSE])


register(
    OutputFormat(
        "tarball",
        "the adapter folder as one .tar",
        files,
        serve,
        exporter=f"{__name__}:export",
        check=f"{__name__}:check",
        order=50,
    )
)
'''
HUB = {"model": {"source": {"hub": {"id": "org/tiny"}}}, "dataset": {"source": {"hub": {"id": "org/data"}}}}


@pytest.fixture
def tarball(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The throwaway module on sys.path and FINETUNE_PLUGINS, imported as the layers import
    plugins; unregistered and forgotten afterwards."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(textwrap.dedent(SOURCE), encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv(PLUGINS_ENV, MODULE)
    FORMATS.names()  # the package's own formats first, as any first use finds them
    load_plugins()
    try:
        yield "tarball"
    finally:
        FORMATS.unregister("tarball")
        sys.modules.pop(MODULE, None)


def _spec(**overrides: Any) -> FineTuneJobSpec:
    return FineTuneJobSpec.model_validate(body(**{"output": {"pvc": {"claimName": "outputs"}}, **overrides}))


def _config(root: Path, spec: FineTuneJobSpec) -> TrainerConfig:
    paths = RuntimePaths(model=str(root / "model"), dataset="org/data", output=str(root / "out"))
    return TrainerConfig(job_name="tiny", namespace="team-a", job_uid="0000-uid", spec=spec, paths=paths)


def test_the_spec_accepts_it_and_only_while_it_is_registered(tarball: str) -> None:
    spec = _spec(output={"pvc": {"claimName": "outputs"}, "formats": ["tarball"]})
    assert spec.output.written == ("peft", "tarball")
    FORMATS.unregister(tarball)
    with pytest.raises(ValueError, match="Input should be 'peft', 'merged', 'gguf-lora' or 'gguf'"):
        _spec(output={"pvc": {"claimName": "outputs"}, "formats": ["tarball"]})


def test_the_crd_enum_and_the_api_reference_list_it(tarball: str) -> None:
    schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    formats = schema["properties"]["spec"]["properties"]["output"]["properties"]["formats"]
    assert formats["items"]["enum"] == ["peft", "merged", "gguf-lora", "gguf", "tarball"]
    assert "tarball (the adapter folder as one .tar)" in formats["description"]
    row = next(line for line in reference.render().splitlines() if line.startswith("| `output.formats` |"))
    assert "`tarball`" in row and "tarball (the adapter folder as one .tar)" in row


def test_the_operator_status_gives_its_file_and_serve_command(tarball: str) -> None:
    spec = _spec(output={"pvc": {"claimName": "outputs", "path": "runs/a"}, "formats": ["tarball"]})
    out = output_status("tiny", spec, "outputs")
    (entry,) = [f for f in out["formats"] if f["format"] == tarball]
    assert entry["path"] == "/mnt/output/runs/a/adapter.tar"
    assert entry["serve"].startswith("tar -xf /mnt/output/runs/a/adapter.tar && vllm serve ")
    assert [f["format"] for f in out["formats"]] == ["peft", "tarball"]


def test_the_pre_flight_runs_its_check(tarball: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from finetune_trainer.failures import TrainerFailure
    from finetune_trainer.launch.input_check import check_inputs

    config = _config(tmp_path, _spec(**HUB, output={"pvc": {"claimName": "outputs"}, "formats": ["tarball"]}))
    assert check_inputs(config)["formats"] == [tarball]
    monkeypatch.setenv("THROWAWAY_TARBALL_REFUSE", "no tar here")
    with pytest.raises(TrainerFailure) as refused:
        check_inputs(config)
    assert refused.value.message == "spec.output.formats: tarball: no tar here"


@pytest.mark.trainer
def test_the_trainer_export_writes_it_from_a_saved_adapter(tarball: str, tmp_path: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from finetune_trainer.model.tiny_model import make_tiny_model
    from finetune_trainer.outputs.export import save_formats

    base = make_tiny_model(tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    adapter = tmp_path / "out" / "adapter"
    get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])).save_pretrained(str(adapter))
    spec = _spec(output={"pvc": {"claimName": "outputs"}, "formats": ["tarball"]})
    exported = save_formats(_config(tmp_path, spec), adapter, AutoTokenizer.from_pretrained(str(base)), adapter.parent)
    assert exported.failed == {}
    assert exported.written == {"peft": adapter, tarball: tmp_path / "out" / "adapter.tar"}
    with tarfile.open(exported.written[tarball]) as tar:
        assert "adapter/adapter_config.json" in tar.getnames()

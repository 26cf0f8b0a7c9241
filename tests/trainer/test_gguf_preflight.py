"""A GGUF job (gguf or gguf-lora) whose model llama.cpp's converter cannot convert fails in its CPU
pre-flight (`--check-inputs`, the pre-flight Job's command), naming the format and the converter's
cause, before any GPU time: the check runs the converter's own vocabulary pass
(`convert_hf_to_gguf.py --vocab-only`) over the model's own tokenizer.

The tiny model's tokenizer (a byte-level BPE trained here) has a pre-tokenizer whose hash
llama.cpp's `get_vocab_base_pre` does not know, so the converter refuses it, as it refuses a new
model family's before llama.cpp learns it; the tiny model with Llama 2's kind of tokenizer
(sentencepiece-style BPE, no pre-tokenizer hash needed) passes."""

import shutil
from pathlib import Path

import pytest

from finetune_api.reasons import ExitReason
from finetune_trainer.model.tiny_model import make_tiny_model
from finetune_trainer.outputs.gguf_export import CONVERTERS_ENV
from hack import llama_cpp as pinned
from tests.trainer.conftest import JobDir
from tests.trainer.test_input_check import check

pytestmark = [pytest.mark.trainer, pytest.mark.llama_cpp]

REFUSED = (
    "llama.cpp's converter cannot convert this model's tokenizer: "
    "BPE pre-tokenizer was not recognized - update get_vocab_base_pre()"
)


@pytest.fixture
def converters(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The pinned converters (unpacked from the sdist once), as the image has them."""
    folder = pinned.converters()
    monkeypatch.setenv(CONVERTERS_ENV, str(folder))
    return folder


@pytest.mark.parametrize("fmt", ["gguf", "gguf-lora"])
def test_a_tokenizer_the_converter_refuses_fails_the_pre_flight_in_one_line(
    job_dir: JobDir, converters: Path, fmt: str
) -> None:
    job_dir.spec_changes = {"output": {"formats": [fmt]}}
    code, said, events = check(job_dir)
    assert code == ExitReason.InvalidConfig
    assert said == f"InvalidConfig: spec.output.formats: {fmt}: {REFUSED}"
    assert not [e for e in events if e["event"] == "inputsChecked"]


def test_a_tokenizer_the_converter_takes_passes_and_a_job_without_gguf_is_not_checked(
    job_dir: JobDir, converters: Path, tmp_path: Path
) -> None:
    job_dir.spec_changes = {"output": {"formats": ["peft"]}}
    code, said, events = check(job_dir)  # the refused tokenizer, but no GGUF asked: not looked at
    assert (code, said) == (0, "")
    (checked,) = [e for e in events if e["event"] == "inputsChecked"]
    assert checked["formats"] == []
    # The same job on the tiny model with Llama 2's kind of tokenizer: both GGUF formats pass.
    models = job_dir.root / "models"
    models.unlink()
    make_tiny_model(models / "tiny-llama", llama_tokenizer=True)
    job_dir.spec_changes = {"output": {"formats": ["gguf-lora", "gguf"]}}
    code, said, events = check(job_dir)
    assert (code, said) == (0, ""), said
    (checked,) = [e for e in events if e["event"] == "inputsChecked"]
    assert checked["formats"] == ["gguf-lora"]  # one check for both: the converter's pass, once
    assert not list(job_dir.root.rglob("*.gguf")), "the vocabulary pass writes into a scratch folder only"
    shutil.rmtree(models)

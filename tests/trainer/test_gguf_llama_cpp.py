"""GGUF read back by real llama.cpp: the base + LoRA GGUF and the merged GGUF, written by
llama.cpp's own pinned converters (gguf_export.py), give the PEFT model's next-token logits.

llama.cpp runs through llama-cpp-python's bindings over libllama built from the same pinned
sdist (hack/llama_cpp.py builds it once into the cache: minutes the first time). Token ids go in
as Hugging Face's tokenizer makes them, so the comparison is of the weights, not the tokenizers.
"""

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from finetune_trainer.gguf_export import CONVERTERS_ENV, convert_lora, convert_model
from finetune_trainer.merge_stream import merge_folder
from finetune_trainer.tiny_model import make_tiny_model
from hack import llama_cpp as pinned

# The first run builds libllama (hack/llama_cpp.py; `make test` builds it before pytest starts):
# minutes on two busy cores, beyond the suite's per-test limit.
pytestmark = pytest.mark.timeout(3600)

PROMPTS = ["What sound does a cow make?", "Give the opposite of the word. hot", "Repeat the colours. red blue"]
# f16 weights against the fp32 model: logits of magnitude ~3 move by a few 1e-3; 0.05 holds
# with room (the measured figure is printed) and is far below the adapter's own effect (> 0.5).
F16_TOLERANCE = 0.05
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def llama() -> Any:
    """The pinned converters on FINETUNE_LLAMA_CPP and `llama_cpp` importable (built once)."""
    os.environ[CONVERTERS_ENV] = str(pinned.converters())
    folder = str(pinned.python_package())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import llama_cpp

    return llama_cpp


@pytest.fixture(scope="module")
def exported(llama: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny model, a trained-looking adapter, and every GGUF the job writes from them."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("gguf")
    base = make_tiny_model(root / "base", llama_tokenizer=True)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(str(root / "adapter"))
    merge_folder(base, root / "adapter", root / "merged")
    return {
        "base": base,
        "adapter": root / "adapter",
        "base.gguf": convert_model(base, root / "gguf" / "base-f16.gguf", "f16"),
        "adapter.gguf": convert_lora(root / "adapter", base, root / "gguf" / "adapter-f16.gguf", "f16"),
        "merged.gguf": convert_model(root / "merged", root / "gguf" / "merged-f16.gguf", "f16"),
    }


def _hf_logits(files: dict[str, Path]) -> tuple[list[list[int]], list[torch.Tensor], list[torch.Tensor]]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(files["base"]))
    model = AutoModelForCausalLM.from_pretrained(str(files["base"]), dtype=torch.float32).eval()
    peft = PeftModel.from_pretrained(model, str(files["adapter"])).eval()
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    with torch.no_grad():
        tuned = [peft(torch.tensor([i])).logits[0] for i in ids]
        with peft.disable_adapter():
            plain = [peft(torch.tensor([i])).logits[0] for i in ids]
    return ids, tuned, plain


def _llama_logits(llama: Any, model: Path, lora: Path | None, ids: list[int]) -> torch.Tensor:
    llm = llama.Llama(
        model_path=str(model),
        lora_path=str(lora) if lora else None,
        n_ctx=128,
        n_threads=2,
        logits_all=True,
        verbose=False,
    )
    llm.eval(ids)
    logits = torch.tensor(llm.scores[: len(ids)], dtype=torch.float32)
    llm.close()
    return logits


@pytest.mark.parametrize("form", ["base + lora", "merged"])
def test_llama_cpp_gives_the_peft_models_logits(llama: Any, exported: dict[str, Path], form: str) -> None:
    ids, tuned, plain = _hf_logits(exported)
    worst = 0.0
    for prompt_ids, expected, without in zip(ids, tuned, plain, strict=True):
        if form == "merged":
            got = _llama_logits(llama, exported["merged.gguf"], None, prompt_ids)
        else:
            got = _llama_logits(llama, exported["base.gguf"], exported["adapter.gguf"], prompt_ids)
        assert got.shape == expected.shape
        worst = max(worst, float((got - expected).abs().max()))
        # Greedy decoding agrees at every position, and the adapter's effect is far above the noise.
        assert torch.equal(got.argmax(-1), expected.argmax(-1)), form
        assert float((expected - without).abs().max()) > 10 * F16_TOLERANCE
    print(f"{form}: max |logit difference| llama.cpp f16 vs PEFT fp32 = {worst:.4f}")
    assert worst < F16_TOLERANCE


def test_the_llama_server_command_of_the_status_loads_in_llama_cpp(llama: Any, exported: dict[str, Path]) -> None:
    """What `llama-server -m BASE --lora ADAPTER` loads: the same two files, through the library."""
    from finetune_api.contract import gguf_adapter_file, gguf_base_file

    assert exported["base.gguf"].name == Path(gguf_base_file("f16")).name
    assert exported["adapter.gguf"].name == Path(gguf_adapter_file()).name
    llm = llama.Llama(
        model_path=str(exported["base.gguf"]), lora_path=str(exported["adapter.gguf"]), n_ctx=64, verbose=False
    )
    out = llm.create_completion("What sound does a cow make?", max_tokens=4, temperature=0.0)
    assert out["choices"][0]["text"] is not None
    llm.close()


def test_a_trained_job_writes_every_format_and_its_gguf_answers_like_its_adapter(
    llama: Any, exported: dict[str, Path], tmp_path: Path
) -> None:
    """The trainer end to end: formats merged, gguf-lora and gguf after a short run, at the paths
    the status names, and llama.cpp's greedy tokens on them are PEFT's on the trained adapter."""
    from finetune_api import contract
    from finetune_trainer.tiny_model import write_alpaca
    from tests.trainer.conftest import make_job_dir

    assets = tmp_path / "assets"
    (assets / "models").mkdir(parents=True)
    (assets / "models" / "tiny-llama").symlink_to(exported["base"])
    write_alpaca(assets / "datasets" / "alpaca.jsonl")
    (tmp_path / "job").mkdir()
    job = make_job_dir(tmp_path / "job", assets)
    job.spec_changes = {
        "training": {"maxSteps": 6},
        "checkpoints": {"everySteps": 6},
        "output": {"formats": ["merged", "gguf-lora", "gguf"], "samples": {"count": 0}},
    }
    run = job.run(timeout=900, env={CONVERTERS_ENV: os.environ[CONVERTERS_ENV]})
    assert run.code == 0, run.stderr[-3000:]
    summary = json.loads((job.output / "summary.json").read_text())
    assert sorted(summary["formats"]) == ["gguf", "gguf-lora", "merged", "peft"]
    assert summary["formats"]["gguf"] == str(job.output / contract.gguf_merged_file("f16"))
    assert summary["formats"]["gguf-lora"] == str(job.output / contract.gguf_adapter_file())
    assert (job.output / contract.gguf_base_file("f16")).is_file()
    assert not (job.output / ".merged-for-gguf").exists()
    ids, tuned, _ = _hf_logits({"base": exported["base"], "adapter": job.output / "adapter"})
    for prompt_ids, expected in zip(ids, tuned, strict=True):
        lora = _llama_logits(
            llama, job.output / contract.gguf_base_file("f16"), job.output / contract.gguf_adapter_file(), prompt_ids
        )
        merged = _llama_logits(llama, job.output / contract.gguf_merged_file("f16"), None, prompt_ids)
        for got in (lora, merged):
            assert torch.equal(got.argmax(-1), expected.argmax(-1))
            assert float((got - expected).abs().max()) < F16_TOLERANCE

"""`ftjob validate --model-config`, `ftjob plan` and `ftjob check-data --tokenizer` know the family
(issue #24): an unsupported family or a missing target is one line and a non-zero exit before any
GPU time; a supported one is named with its attention kernel and what LoRA goes on."""

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_plan import choose
from finetune_plan.families import FAMILIES, UnsupportedModel, check_model, family_of, resolve_targets
from tests.support.cli import REPO, assert_one_line_error, ftjob

EXAMPLE_TINY = REPO / "examples" / "tiny-job.yaml"
SIZES = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}


def _config(tmp_path: Path, model_type: str, architecture: str, **extra: Any) -> Path:
    folder = tmp_path / model_type
    folder.mkdir()
    body = {"model_type": model_type, "architectures": [architecture], **SIZES, **extra}
    (folder / "config.json").write_text(json.dumps(body))
    return folder


def _job(tmp_path: Path, targets: Any, gpus: int = 1) -> Path:
    body = yaml.safe_load(EXAMPLE_TINY.read_text())
    body["spec"]["lora"]["targetModules"] = targets
    body["spec"]["resources"]["gpus"] = gpus
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def _one_stdout_line(result: Any, *fragments: str) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    return assert_one_line_error(result, *fragments, on_stdout=True)


REFUSALS = [
    # (model_type, architecture, targets, what the line says)
    ("gpt2", "GPT2LMHeadModel", ["q_proj"], "not a supported model family"),
    ("mixtral", "MixtralForCausalLM", ["q_proj"], "mixture-of-experts"),
    ("qwen2_moe", "Qwen2MoeForCausalLM", ["q_proj"], "mixture-of-experts"),
    ("llama", "LlamaForCausalLM", ["q_proj", "qkv_proj"], "spec.lora.targetModules: qkv_proj"),
    ("phi3", "Phi3ForCausalLM", ["q_proj", "w1"], "spec.lora.targetModules: w1"),
]


@pytest.mark.parametrize(("model_type", "architecture", "targets", "fragment"), REFUSALS)
def test_validate_and_plan_refuse_in_one_line(
    tmp_path: Path, model_type: str, architecture: str, targets: list[str], fragment: str
) -> None:
    model = _config(tmp_path, model_type, architecture)
    job = str(_job(tmp_path, targets))
    _one_stdout_line(ftjob("validate", job, "--model-config", str(model)), fragment)
    assert_one_line_error(ftjob("plan", job, "--model-config", str(model)), fragment)
    # A CPU job plans no memory but is refused all the same.
    assert_one_line_error(ftjob("plan", str(_job(tmp_path, targets, gpus=0)), "--model-config", str(model)), fragment)


def test_a_missing_target_names_the_models_linear_modules(tmp_path: Path) -> None:
    model = _config(tmp_path, "llama", "LlamaForCausalLM")
    line = _one_stdout_line(ftjob("validate", str(_job(tmp_path, ["qkv_proj"])), "--model-config", str(model)))
    assert "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj" in line


@pytest.mark.trainer  # `check-data --tokenizer` loads the trainer's stack in its process
def test_check_data_refuses_an_unsupported_model_folder(tmp_path: Path) -> None:
    model = _config(tmp_path, "gpt2", "GPT2LMHeadModel")
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"text": "hello"}) + "\n")
    result = ftjob("check-data", str(data), "--format", "text", "--tokenizer", str(model))
    assert_one_line_error(result, "--tokenizer", "not a supported model family")


def test_gemma2_is_planned_with_eager_attention(tmp_path: Path) -> None:
    gemma2 = _config(tmp_path, "gemma2", "Gemma2ForCausalLM", head_dim=64, final_logit_softcapping=30.0)
    job = str(_job(tmp_path, ["q_proj", "k_proj", "v_proj", "o_proj"]))
    result = ftjob("plan", job, "--model-config", str(gemma2), "--max-length", "2048")
    assert result.returncode == 0, result.stderr
    assert "attention materialised" in result.stdout
    assert "attention eager (Gemma 2" in result.stdout
    assert "logits softcap by final_logit_softcapping" in result.stdout
    valid = ftjob("validate", job, "--model-config", str(gemma2))
    assert valid.returncode == 0 and "family Gemma 2 (Gemma2ForCausalLM); attention eager" in valid.stdout


def test_the_planner_charges_gemma2_its_attention_matrix() -> None:
    from finetune_api.spec import FineTuneJobSpec

    body = yaml.safe_load(EXAMPLE_TINY.read_text())["spec"]
    body["training"]["maxLength"] = 2048
    spec = FineTuneJobSpec.model_validate(body)
    shape = {**SIZES, "head_dim": 64}
    llama = choose(spec, {"model_type": "llama", **shape}, 1, attention="memory_efficient")
    gemma2 = choose(spec, {"model_type": "gemma2", **shape}, 1, attention="memory_efficient")
    assert llama.plan is not None and gemma2.plan is not None
    assert llama.plan.recipe.attention == "memory_efficient"
    assert gemma2.plan.recipe.attention == "materialised"
    # In fp32 SDPA keeps the probabilities too (calibration.SDPA_FP32_KEEPS_MATRIX): never less for Gemma 2.
    assert max(g.total for g in gemma2.plan.per_gpu) >= max(g.total for g in llama.plan.per_gpu)


def test_phi3_maps_attention_and_mlp_names_onto_its_fused_projections(tmp_path: Path) -> None:
    phi3 = _config(tmp_path, "phi3", "Phi3ForCausalLM")
    job = str(_job(tmp_path, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    result = ftjob("plan", job, "--model-config", str(phi3))
    assert result.returncode == 0, result.stderr
    assert "LoRA r=8 on qkv_proj,o_proj,gate_up_proj,down_proj" in result.stdout


def test_all_linear_as_a_string_or_a_list_item(tmp_path: Path) -> None:
    llama = _config(tmp_path, "llama", "LlamaForCausalLM")
    every = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    for targets in ("all-linear", ["all-linear"]):
        job = str(_job(tmp_path, targets))
        assert ftjob("validate", job).returncode == 0
        result = ftjob("plan", job, "--model-config", str(llama))
        assert result.returncode == 0, result.stderr
        assert f"LoRA r=8 on {every}" in result.stdout


def test_the_table() -> None:
    for family in FAMILIES.values():
        assert check_model({"model_type": family.model_type}, ["q_proj", "v_proj"])[0] is family
        assert resolve_targets(family, ["all-linear"]) == family.linears
    assert family_of({"architectures": ["Gemma2ForCausalLM"]}).model_type == "gemma2"
    assert family_of(dict(SIZES)).model_type == "llama"  # the planner's own tables name no type
    with pytest.raises(UnsupportedModel, match="text model"):
        family_of({"model_type": "gemma3"})


def test_submit_stores_a_target_string_as_the_list_the_crd_holds(tmp_path: Path) -> None:
    from finetune_cli.submit import _bodies

    (body,) = _bodies(str(_job(tmp_path, "all-linear")))
    assert body["spec"]["lora"]["targetModules"] == ["all-linear"]

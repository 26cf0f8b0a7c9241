"""Every supported family trains correctly (issue #24), through the product's own functions.

For each tiny random-init family model (tests/support/families.py), loaded by the trainer's
`load_model` with the test recipe (NF4, fp32, LoRA), in-process:
- the loss the LossHead computes equals the model's own `model(input_ids, labels=...).loss` on
  the same batch (within 1e-5): Gemma 2's soft-cap and Cohere's / Granite's logit scale
  applied per logit, never to the summed loss;
- LoRA sits on every requested target in every decoder layer (Phi-3: on its fused `qkv_proj`
  and `gate_up_proj`), `all-linear` puts it on every linear layer but the head;
- after two optimizer steps every `lora_B` is non-zero, and the merged model the trainer
  exports gives the logits of the base model plus the adapter.
The whole trainer (`python -m finetune_trainer`, 8 steps, merge) runs for the families that
failed before (Gemma 2, Phi-3) and with `targetModules: all-linear`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from finetune_api.resource import FineTuneJob
from finetune_api.trainer_config import TrainerConfig
from finetune_cli.run_local import local_paths
from finetune_plan.families import FAMILIES as TABLE
from finetune_trainer.data.batches import collate, make_rows
from finetune_trainer.hardware.capabilities import Hardware
from finetune_trainer.memory.budget import MemoryPlan
from finetune_trainer.model import families
from finetune_trainer.model.dropout import dropout_off
from finetune_trainer.model.loading import load_model, load_model_config, load_tokenizer
from finetune_trainer.model.loss_head import install
from finetune_trainer.model.tiny_model import alpaca_records, write_alpaca
from finetune_trainer.modes import for_run
from finetune_trainer.objectives.sft import loss_sum
from finetune_trainer.outputs.export import save_adapter, save_merged
from finetune_trainer.state.train_state import Adapter
from tests.support.families import FAMILIES, make_family_model
from tests.trainer.conftest import BASE_JOB, JobDir, _merge

pytestmark = pytest.mark.trainer

LOSS_TOLERANCE = 1e-5
LOGITS_TOLERANCE = 1e-4
DEFAULT = ["q_proj", "k_proj", "v_proj", "o_proj"]
# What the default targets and all-linear adapt in each family's decoder layers.
ADAPTED_BY_DEFAULT = {"phi3": ["qkv_proj", "o_proj"]}
ALL_LINEAR = {"phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]}
LLAMA_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DIR/models/<family> for every family, DIR/datasets/alpaca.jsonl."""
    root = tmp_path_factory.mktemp("families")
    for name in FAMILIES:
        make_family_model(name, root / "models" / name)
    write_alpaca(root / "datasets" / "alpaca.jsonl", count=64)
    return root


def _spec(name: str, targets: Any, **changes: Any) -> dict[str, Any]:
    return _merge(
        {
            "model": {"source": {"pvc": {"claimName": "models", "path": name}}},
            "lora": {"r": 4, "alpha": 8, "dropout": 0.05, "targetModules": targets},
        },
        changes,
    )


def _config(root: Path, name: str, targets: Any) -> TrainerConfig:
    body = _merge(BASE_JOB, {"spec": _spec(name, targets), "metadata": {"name": name}})
    job = FineTuneJob.model_validate(body)
    return TrainerConfig(job_name=name, namespace=None, spec=job.spec, paths=local_paths(name, job.spec, root))


def _layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    base: Any = model.get_base_model()  # type: ignore[operator]
    return list(base.model.layers)


def _lora_modules(layer: torch.nn.Module) -> list[str]:
    from peft.tuners.lora import LoraLayer

    return [n.rsplit(".", 1)[-1] for n, m in layer.named_modules() if isinstance(m, LoraLayer)]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_trains_like_its_own_forward(models: Path, name: str, tmp_path: Path) -> None:
    all_linear = name in ("phi3", "gemma2", "llama-tied")
    targets: Any = "all-linear" if all_linear else DEFAULT
    config = _config(models, name, targets)
    model_config = load_model_config(config)
    family = families.check(model_config, config.spec)
    attention = families.kernel(family, "sdpa_expanded")
    assert attention == ("eager" if name == "gemma2" else "sdpa_expanded")
    tokenizer = load_tokenizer(config)
    model = load_model(
        config,
        Hardware(()),
        "fp32",
        attention,
        MemoryPlan(None, "cpu", {}),
        mode=for_run("dataParallel", 1),
        device=torch.device("cpu"),
        seed=0,
    )

    # LoRA on every requested target of every layer, nothing on the head.
    expected = ALL_LINEAR.get(name, LLAMA_LINEARS) if all_linear else ADAPTED_BY_DEFAULT.get(name, DEFAULT)
    for index, layer in enumerate(_layers(model)):
        assert sorted(_lora_modules(layer)) == sorted(expected), f"layer {index}"
    adapted = families.adapted(model)
    assert sorted(adapted["modules"]) == sorted(expected) and adapted["layers"] == len(expected) * 2

    samples = [{"prompt": f"{r['instruction']} {r['input']}", "completion": r["output"]} for r in alpaca_records(4, 3)]
    rows = make_rows(samples, tokenizer, 64, packing=False)
    batch = collate(rows, int(tokenizer.pad_token_id), torch.device("cpu"), packed=False)
    targets_count = sum(r.targets for r in rows)
    # Dropout off the way the trainer's evaluation does it: eval() would repack bitsandbytes'
    # CPU weights for inference.
    model.train()
    with torch.no_grad(), dropout_off(model):
        own = float(model(**batch, use_cache=False).loss)
    head = install(model, 0)
    with torch.no_grad(), dropout_off(model):
        ours = float(loss_sum(model, head, batch)) / targets_count
    assert abs(ours - own) < LOSS_TOLERANCE, (name, ours, own)
    # The transform is applied once: the model's forward no longer transforms the head's output.
    if name in ("gemma2", "gemma3"):
        assert model.config.final_logit_softcapping is None and head.transform is not None
    with torch.no_grad(), dropout_off(model):  # chunked, as the planner may ask for: the same sum
        chunked = install_chunks(model, head, batch, 7) / targets_count
    assert abs(chunked - own) < LOSS_TOLERANCE

    adapter = Adapter.of(model)
    optimizer = torch.optim.AdamW(adapter.params, lr=1e-2)
    for _ in range(2):
        optimizer.zero_grad()
        (loss_sum(model, head, batch) / targets_count).backward()
        optimizer.step()
    for pname, param in adapter.named:
        if "lora_B" in pname:
            assert float(param.detach().abs().max()) > 0, pname

    adapter_path = save_adapter(adapter, tokenizer, tmp_path)
    merged_path = save_merged(config, adapter_path, tokenizer, tmp_path)
    _assert_merged_is_base_plus_adapter(config, adapter_path, merged_path, attention, batch)


def install_chunks(model: torch.nn.Module, head: Any, batch: dict[str, torch.Tensor], size: int) -> float:
    head.chunk_tokens = size
    try:
        return float(loss_sum(model, head, batch))
    finally:
        head.chunk_tokens = 0


def _assert_merged_is_base_plus_adapter(
    config: TrainerConfig, adapter: Path, merged: Path, attention: str, batch: dict[str, torch.Tensor]
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    inputs = {k: v for k, v in batch.items() if k != "labels"}
    kwargs: dict[str, Any] = {"dtype": torch.float32, "attn_implementation": attention}
    base = AutoModelForCausalLM.from_pretrained(config.paths.model, **kwargs)
    with_adapter = PeftModel.from_pretrained(base, str(adapter)).eval()
    folded = AutoModelForCausalLM.from_pretrained(str(merged), **kwargs).eval()
    with torch.no_grad():
        expected = with_adapter(**inputs, use_cache=False).logits
        got = folded(**inputs, use_cache=False).logits
        plain = AutoModelForCausalLM.from_pretrained(config.paths.model, **kwargs).eval()(**inputs).logits
    assert float((expected - got).abs().max()) < LOGITS_TOLERANCE
    assert float((expected - plain).abs().max()) > LOGITS_TOLERANCE, "the adapter changed nothing"


def test_every_family_of_the_table_is_in_the_matrix(models: Path) -> None:
    built = {json.loads((models / "models" / name / "config.json").read_text())["model_type"] for name in FAMILIES}
    assert built == set(TABLE)


def _job(root: Path, models: Path, name: str, targets: Any) -> JobDir:
    for claim in ("models", "datasets"):
        (root / claim).symlink_to(models / claim)
    (root / "outputs").mkdir()
    changes = _spec(name, targets, training={"maxSteps": 8}, checkpoints={"everySteps": 8}, output={"merge": True})
    return JobDir(root, spec_changes=changes)


@pytest.mark.parametrize(("name", "targets"), [("gemma2", DEFAULT), ("phi3", "all-linear")])
def test_the_trainer_runs_the_families_that_failed(models: Path, tmp_path: Path, name: str, targets: Any) -> None:
    job = _job(tmp_path, models, name, targets)
    run = job.run(timeout=600)
    assert run.code == 0, run.stderr[-3000:]
    summary = json.loads((job.output / "summary.json").read_text())
    assert summary["finalStep"] == 8
    assert summary["attention"] == ("eager" if name == "gemma2" else "sdpa_expanded")
    expected = ADAPTED_BY_DEFAULT.get(name, DEFAULT) if targets == DEFAULT else ALL_LINEAR[name]
    assert sorted(summary["lora"]["modules"]) == sorted(expected) and summary["lora"]["layers"] == 2 * len(expected)
    assert summary["mergedPath"]
    start = run.of("start")[0]
    assert start["lora"] == summary["lora"]
    assert start["family"] == TABLE[name].label


def test_the_trainer_refuses_a_missing_target_in_one_line(models: Path, tmp_path: Path) -> None:
    job = _job(tmp_path, models, "llama", ["q_proj", "qkv_proj"])
    run = job.run(timeout=300)
    assert run.code == 10, run.stderr[-3000:]  # InvalidConfig: not retried
    assert run.termination.startswith("InvalidConfig: spec.lora.targetModules: qkv_proj")
    assert "\n" not in run.termination.strip()
    assert "Traceback" not in run.stderr


def test_the_trainer_refuses_an_unsupported_family_in_one_line(models: Path, tmp_path: Path) -> None:
    make_family_model("llama", models / "models" / "gpt2", config_class="GPT2Config")
    job = _job(tmp_path, models, "gpt2", DEFAULT)
    run = job.run(timeout=300)
    assert run.code == 10, run.stderr[-3000:]
    assert "not a supported model family" in run.termination
    assert "\n" not in run.termination.strip()
    assert "Traceback" not in run.stderr


def test_the_status_says_what_was_adapted() -> None:
    from finetune_api.status import FineTuneJobStatus
    from finetune_trainer.reporting.progress import Progress

    progress = Progress(None, None, 8)
    progress.lora = {"modules": ["qkv_proj", "o_proj"], "layers": 4}
    progress.begin(0)
    progress.step(1, loss=2.0, lr=1e-3, tokens=10, epoch=0.1, report=True)
    status = progress.status_progress()
    assert status["loraModules"] == ["qkv_proj", "o_proj"] and status["loraLayers"] == 4
    parsed = FineTuneJobStatus.model_validate({"progress": status})
    assert parsed.progress is not None and parsed.progress.lora_layers == 4

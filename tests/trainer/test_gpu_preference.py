"""Preference tuning on a GPU: the pieces DPO adds to the step, on NF4 weights with bitsandbytes'
CUDA kernels (CI has no GPU; the CPU tests cover the math against TRL).

- the reference (`adapters_off`) is the model with its adapter off, bit for bit PEFT's own
  `disable_adapter()`, on 4-bit LoRA layers;
- the LM head's per-sequence sums in chunks give the whole-sequence sums and gradients;
- a DPO micro-batch (reference and policy forward, backward) makes no half tensor: the
  precision guard watches every module's output;
- the pair split (chosen, then rejected) gives the unsplit micro-batch's loss and gradients, and
  with LoRA dropout on, each side's forward with gradients draws the masks of its forward
  without (the CUDA generators restored between).

Needs a GPU; run on a GPU machine with `make test-gpu` or `python -m pytest -m gpu` on this file.
"""

from pathlib import Path
from typing import Any

import pytest
import torch

needs_gpu = pytest.mark.gpu  # skipped where no CUDA GPU is visible (tests/conftest.py)
PAIRS = 3


def _model(folder: Path, chunk_tokens: int, dropout: float = 0.0) -> tuple[Any, Any]:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    from finetune_trainer.model.loss_head import install

    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=512,
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
        )
        LlamaForCausalLM(config).save_pretrained(str(folder))
    quant = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.float32,
        bnb_4bit_use_double_quant=True,
    )
    base = AutoModelForCausalLM.from_pretrained(
        str(folder), quantization_config=quant, dtype=torch.float32, device_map={"": 0}
    )
    torch.manual_seed(1)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=dropout, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = get_peft_model(base, lora)
    # LoRA's B starts at zero: move it, or the adapter-off pass would equal the adapter-on one anyway.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.02)
    head = install(model, chunk_tokens)
    model.train()
    return model, head


def _side(prompt: list[int], length: int, generator: torch.Generator) -> Any:
    from finetune_trainer.data.batches import Row
    from finetune_trainer.data.tokens import IGNORE

    answer = torch.randint(3, 512, (length,), generator=generator).tolist()
    ids = [1, *prompt, *answer, 2]
    labels = [IGNORE] * (1 + len(prompt)) + [*answer, 2]
    return Row(ids, labels, list(range(len(ids))))


def _batch(objective: Any) -> dict[str, torch.Tensor]:
    from finetune_trainer.objectives.preference import PairRow

    generator = torch.Generator().manual_seed(2)
    rows = []
    for index in range(PAIRS):
        prompt = torch.randint(3, 512, (5 + index,), generator=generator).tolist()

        rows.append(PairRow(_side(prompt, 4 + 2 * index, generator), _side(prompt, 7 - index, generator)))
    return dict(objective.collate(rows, 0, torch.device("cuda", 0), packed=False))


def _dpo() -> Any:
    from finetune_api.objectives import OBJECTIVES
    from finetune_api.resource import FineTuneJob
    from finetune_trainer.objectives import for_spec

    from .conftest import BASE_JOB

    body = {
        **BASE_JOB,
        "spec": {**BASE_JOB["spec"], "dataset": {**BASE_JOB["spec"]["dataset"], "format": "preference"}},
    }
    body["spec"]["training"] = {**BASE_JOB["spec"]["training"], "method": "dpo"}
    objective = for_spec(FineTuneJob.model_validate(body).spec)
    assert objective.entry is OBJECTIVES.get("dpo")
    return objective


@needs_gpu
def test_the_reference_is_peft_with_its_adapter_disabled_on_4_bit_layers(tmp_path: Path) -> None:
    from finetune_trainer.objectives.preference import adapters_off

    model, head = _model(tmp_path / "tiny", 0)
    head.last_logits = True  # the last position's logits: a plain forward through the head
    ids = torch.randint(3, 512, (2, 24), device="cuda")
    with torch.no_grad():
        with_adapter = model(input_ids=ids).logits
        with adapters_off(model):
            ours = model(input_ids=ids).logits
        with model.disable_adapter():
            peft = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
    assert torch.equal(ours, peft)
    assert not torch.equal(ours, with_adapter)  # the adapter did something: the test can fail
    assert torch.equal(after, with_adapter)  # and it is back on


@needs_gpu
def test_chunked_per_sequence_sums_equal_the_whole_sequence_and_the_micro_batch_makes_no_half_tensor(
    tmp_path: Path,
) -> None:
    from finetune_trainer.model.precision_guard import GuardReport, fail_if_half, watch_activations

    objective = _dpo()
    results = []
    for chunk in (0, 7):
        model, head = _model(tmp_path / "tiny", chunk)
        objective.start_step()
        batch = _batch(objective)
        report = GuardReport()
        with watch_activations(model, report):
            total = objective.loss_sum(model, head, batch, [float(PAIRS)])
            total.backward()
        fail_if_half(report)
        assert report.checked_activations > 0
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((float(total), list(objective.sums), grads))
    (whole, whole_sums, whole_grads), (chunked, chunked_sums, chunked_grads) = results
    assert whole == pytest.approx(chunked, rel=1e-5)
    assert whole_sums == pytest.approx(chunked_sums, rel=1e-5, abs=1e-5)
    assert sorted(whole_grads) == sorted(chunked_grads) and whole_grads
    for name, grad in whole_grads.items():
        assert torch.allclose(grad, chunked_grads[name], rtol=1e-4, atol=1e-6), name


def _micro_batch(objective: Any, model: Any, head: Any, batch: dict[str, torch.Tensor]) -> tuple[float, dict]:
    """One micro-batch as the loop runs it: its loss sum, then the backward of that scaled."""
    model.zero_grad(set_to_none=True)
    objective.start_step()
    torch.manual_seed(7)
    total = objective.loss_sum(model, head, batch, [float(PAIRS)])
    (total * (1.0 / PAIRS)).backward()
    return float(total), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@needs_gpu
def test_the_pair_split_trains_as_one_forward_of_both_sides_on_the_gpu(tmp_path: Path) -> None:
    objective = _dpo()
    model, head = _model(tmp_path / "tiny", 0)
    batch = _batch(objective)
    whole_loss, whole = _micro_batch(objective, model, head, batch)
    objective.split = True
    split_loss, split = _micro_batch(objective, model, head, batch)
    assert split_loss == pytest.approx(whole_loss, rel=1e-5)
    assert sorted(split) == sorted(whole) and whole
    for name, grad in whole.items():
        assert torch.allclose(split[name], grad, rtol=1e-4, atol=1e-6), name


@needs_gpu
def test_each_split_side_trains_with_the_dropout_masks_of_its_sums_on_the_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from finetune_trainer.objectives import preference

    objective = _dpo()
    objective.split = True
    model, head = _model(tmp_path / "tiny", 0, dropout=0.5)
    batch = _batch(objective)
    from tests.support.pair_split import policy_passes, record_sums

    original = preference.sequence_sums
    seen = record_sums(monkeypatch)
    _micro_batch(objective, model, head, batch)
    without, with_grad = policy_passes(seen)  # the reference's passes come before the policy's
    for before, after in zip(without, with_grad, strict=True):
        assert torch.allclose(before, after, rtol=1e-6, atol=1e-6)
    torch.manual_seed(8)  # another draw of the masks gives other sums: the masks matter here
    with torch.no_grad():
        part = preference.side(batch, 0, PAIRS)
        again = original(model, head, part, objective.masks(part))
    assert not torch.allclose(again, without[0], rtol=1e-6, atol=1e-6)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-m", "gpu", "-rA", "-p", "no:cacheprovider"]))

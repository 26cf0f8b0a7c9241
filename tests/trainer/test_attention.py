"""The trainer's fp32 attention (`finetune_trainer/model/attention.py`, issue 38): k and v expanded to
every query head and SDPA's fused kernel asked for by name give the math kernel's loss and LoRA
gradients, for every family of the families test, loaded by the product's own `load_model` (NF4,
fp32, LoRA), and for one 70B-shaped attention (64 heads, 8 KV heads, head_dim 128). On the CPU the
fused kernel is PyTorch's CPU flash kernel; `test_gpu_attention.py` holds the memory-efficient
CUDA kernel to the same bound. The self-check at start picks it and falls back where it is missing.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

from finetune_trainer.data.batches import collate, make_rows
from finetune_trainer.hardware.capabilities import Hardware
from finetune_trainer.memory.budget import MemoryPlan
from finetune_trainer.model import attention
from finetune_trainer.model.attention_choice import choose_attention, planned_attention
from finetune_trainer.model.loading import load_model, load_tokenizer
from finetune_trainer.model.tiny_model import alpaca_records
from finetune_trainer.modes import for_run
from tests.support.families import FAMILIES
from tests.trainer.test_families import _config, models  # noqa: F401 (the families' tiny models, one fixture)

pytestmark = pytest.mark.trainer
RELATIVE = 1e-5


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _loss_and_lora_grads(model: Any, batch: dict[str, torch.Tensor]) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(**batch, use_cache=False).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
    return float(loss), grads


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_fused_kernel_trains_as_the_math_kernel(models: Path, name: str, packed: bool) -> None:  # noqa: F811
    config = _config(models, name, ["q_proj", "k_proj", "v_proj", "o_proj"])
    kernel = "eager" if name == "gemma2" else attention.NAME  # as families.kernel decides
    model = load_model(
        config,
        Hardware(()),
        "fp32",
        kernel,  # type: ignore[arg-type]
        MemoryPlan(None, "cpu", {}),
        mode=for_run("dataParallel", 1),
        device=torch.device("cpu"),
        seed=0,
    )
    if kernel == "eager":
        assert model.config._attn_implementation == "eager"  # soft-capped scores: no fused kernel
        return
    assert model.config._attn_implementation == attention.NAME
    # Dropout off: both passes must see the same masks; a batch of rows of different lengths
    # (padded) or of samples packed into one row, so the kernel gets a mask too.
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    tokenizer = load_tokenizer(config)
    samples = [{"prompt": f"{r['instruction']} {r['input']}", "completion": r["output"]} for r in alpaca_records(4, 3)]
    rows = make_rows(samples, tokenizer, 96 if packed else 48, packing=packed)
    batch = collate(rows, int(tokenizer.pad_token_id), torch.device("cpu"), packed=packed)
    if not packed:
        assert int(batch["attention_mask"].sum()) < batch["attention_mask"].numel(), "rows of different lengths"
    fused_loss, fused = _loss_and_lora_grads(model, batch)
    model.set_attn_implementation("sdpa")
    with attention.math_only():
        math_loss, math = _loss_and_lora_grads(model, batch)
    assert abs(fused_loss - math_loss) <= RELATIVE * abs(math_loss), (fused_loss, math_loss)
    assert fused.keys() == math.keys() and fused
    worst = max((relative(fused[n], math[n]), n) for n in math)
    assert worst[0] <= RELATIVE, worst


def test_a_70b_shaped_attention_gives_the_math_kernels_output_and_gradients() -> None:
    """One Llama-3.3-70B attention (hidden 8192, 64 heads, 8 KV heads, head_dim 128) through
    transformers' own module, fused against math, 128 tokens (the GPU test runs 2048)."""
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=8192, intermediate_size=128, num_attention_heads=64, num_key_value_heads=8, num_hidden_layers=1
    )
    layer = LlamaAttention(config, layer_idx=0).float()
    rotary = LlamaRotaryEmbedding(config)
    hidden = torch.randn(1, 128, 8192) * 0.5
    positions = rotary(hidden, torch.arange(128)[None])
    results = []
    for implementation in (attention.NAME, "sdpa"):
        attention.register()
        config._attn_implementation = implementation
        layer.zero_grad(set_to_none=True)
        x = hidden.clone().requires_grad_(True)
        with attention.math_only() if implementation == "sdpa" else torch.enable_grad():
            out, _ = layer(x, position_embeddings=positions, attention_mask=None)
            (out.square().sum() / out.numel()).backward()
        results.append((out.detach(), x.grad, [p.grad.clone() for p in layer.parameters()]))
    (out_f, dx_f, grads_f), (out_m, dx_m, grads_m) = results
    assert relative(out_f, out_m) <= RELATIVE
    assert relative(dx_f, dx_m) <= RELATIVE
    assert max(relative(f, m) for f, m in zip(grads_f, grads_m, strict=True)) <= RELATIVE


def test_the_mask_is_aligned_for_the_kernel_and_holds_the_lowest_value_not_minus_infinity() -> None:
    allowed = torch.ones(2, 1, 5, 37, dtype=torch.bool).tril()
    allowed[1, ..., 30:] = False
    bias = attention.aligned_mask(allowed, torch.float32)
    assert bias.shape == allowed.shape and bias.stride(-2) % attention.MASK_ALIGNMENT == 0
    assert torch.equal(bias == 0, allowed) and torch.isfinite(bias).all()


def test_the_self_check_picks_the_fused_kernel_in_fp32_and_falls_back_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cpu = Hardware(())
    assert choose_attention(cpu, 128, torch.float32) == attention.NAME
    assert planned_attention(attention.NAME, torch.float32) == "memory_efficient"
    assert planned_attention("sdpa", torch.float32) == "materialised"  # fp32 GQA: the math kernel
    assert planned_attention("sdpa", torch.bfloat16) == "memory_efficient"

    def missing(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(attention, "fused_attention", missing)
    with caplog.at_level(logging.WARNING, logger="finetune_trainer.model.attention_choice"):
        assert choose_attention(cpu, 128, torch.float32) == "sdpa"
    assert "sdpa_expanded failed at head_dim 128 (No available kernel" in caplog.text

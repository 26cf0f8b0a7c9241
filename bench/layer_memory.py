"""Per-layer GPU memory of the QLoRA recipe, measured, for the planner's projections.

On the real model (NF4 double quant, fp32 compute, LoRA on q/k/v/o) it records, for one decoder
layer at each sequence length:
  weights_bytes          NF4 data + quantisation constants + LoRA of one layer, as allocated
  saved_ckpt_bytes       what one layer keeps alive until backward with gradient checkpointing
  saved_full_bytes       the same without checkpointing (every activation autograd keeps)
  forward_peak_bytes     transient peak above the layer's input while its forward runs
  backward_peak_bytes    transient peak of recompute + backward of that layer (checkpointed)
and for the head: embedding and lm_head bytes, and the transient peak of lm_head + cross-entropy
+ its backward (the fp32 logits). Everything is read from the CUDA caching allocator
(memory_allocated / max_memory_allocated), so fragmentation is not in these figures.

    python -m bench.layer_memory '{"path": ..., "seqs": [1024, 2048]}'
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

torch.backends.cuda.matmul.allow_tf32 = False


def _tensor_bytes(module: torch.nn.Module) -> int:
    total = sum(p.numel() * p.element_size() for p in module.parameters())
    total += sum(b.numel() * b.element_size() for b in module.buffers())
    for sub in module.modules():  # NF4 quantisation constants hang off the weight, not as params
        state = getattr(getattr(sub, "weight", None), "quant_state", None)
        if state is None:
            continue
        for value in (state.absmax, getattr(state, "code", None)):
            if isinstance(value, torch.Tensor):
                total += value.numel() * value.element_size()
        nested = getattr(state, "state2", None)
        if nested is not None:
            total += sum(t.numel() * t.element_size() for t in (nested.absmax, nested.code))
    return total


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def _peak(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def _reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _decoder(model: torch.nn.Module) -> torch.nn.Module:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model


def measure_layer(model: torch.nn.Module, seq: int, device: torch.device) -> dict[str, int]:
    decoder = _decoder(model)
    layer = decoder.layers[0]
    hidden = decoder.config.hidden_size
    x = torch.randn(1, seq, hidden, device=device, requires_grad=True)
    positions = torch.arange(seq, device=device)[None]
    rotary = decoder.rotary_emb(x, positions)
    # Without checkpointing: what autograd keeps after the forward, and the forward's peak. The
    # layer checkpoints itself when the model has checkpointing on, so switch that off here.
    checkpointed = getattr(layer, "gradient_checkpointing", False)
    layer.gradient_checkpointing = False
    _reset(device)
    base = _allocated(device)
    out = layer(x, position_embeddings=rotary, attention_mask=None, position_ids=positions)
    out = out[0] if isinstance(out, tuple) else out
    forward_peak = _peak(device) - base
    saved_full = _allocated(device) - base - out.numel() * out.element_size()
    grad = torch.randn_like(out)
    _reset(device)
    before_backward = _allocated(device)
    out.backward(grad)
    backward_peak_full = _peak(device) - before_backward
    del out
    x.grad = None
    layer.gradient_checkpointing = checkpointed
    # With checkpointing (the model's own, as the trainer enables it): only the input is kept;
    # backward recomputes the forward, then runs it back.
    _reset(device)
    base = _allocated(device)
    out = layer(x, position_embeddings=rotary, attention_mask=None, position_ids=positions)
    out = out[0] if isinstance(out, tuple) else out
    saved_ckpt = _allocated(device) - base - out.numel() * out.element_size()
    _reset(device)
    before_backward = _allocated(device)
    out.backward(grad)
    backward_peak_ckpt = _peak(device) - before_backward
    return dict(
        seq=seq,
        input_bytes=x.numel() * x.element_size(),
        layer_checkpointed=bool(checkpointed),
        saved_ckpt_bytes=max(0, saved_ckpt),
        saved_full_bytes=saved_full,
        forward_peak_bytes=forward_peak,
        backward_peak_full_bytes=backward_peak_full,
        backward_peak_ckpt_bytes=backward_peak_ckpt,
    )


def measure_head(model: torch.nn.Module, seq: int, device: torch.device) -> dict[str, int]:
    base_model = model.get_base_model() if hasattr(model, "get_base_model") else model
    head, norm = base_model.lm_head, _decoder(model).norm
    hidden = torch.randn(1, seq, head.in_features, device=device, requires_grad=True)
    labels = torch.randint(0, head.out_features, (1, seq), device=device)
    _reset(device)
    base = _allocated(device)
    _reset(device)
    logits = head(norm(hidden)).float()
    loss = torch.nn.functional.cross_entropy(logits[0, :-1], labels[0, 1:])
    loss.backward()
    return dict(seq=seq, head_peak_bytes=_peak(device) - base)


def load(path: str, device: torch.device) -> torch.nn.Module:
    """The recipe's model on one device: NF4 + double quant, fp32 compute, norms and head fp32, LoRA r=8 on q/k/v/o."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    quant = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.float32,
        bnb_4bit_use_double_quant=True,
    )
    model = AutoModelForCausalLM.from_pretrained(
        path,
        quantization_config=quant,
        device_map={"": device.index if device.type == "cuda" else "cpu"},
        dtype=torch.float32,
        attn_implementation="sdpa",
    )
    for name, module in model.named_modules():
        if "norm" in name.lower() or "lm_head" in name.lower():
            module.to(torch.float32)
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    torch.manual_seed(0)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = get_peft_model(model, lora)
    model.train()
    return model


def run(spec: dict[str, Any]) -> dict[str, Any]:
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    model = load(spec["path"], device)
    loaded = _allocated(device)
    decoder = _decoder(model)
    base_model = model.get_base_model()
    layers = [measure_layer(model, seq, device) for seq in spec.get("seqs", [2048])]
    heads = [measure_head(model, seq, device) for seq in spec.get("seqs", [2048])]
    config = decoder.config
    return dict(
        shape=dict(
            hidden=config.hidden_size,
            inter=config.intermediate_size,
            heads=config.num_attention_heads,
            kv=config.num_key_value_heads,
            vocab=config.vocab_size,
        ),
        layer_weights_bytes=_tensor_bytes(decoder.layers[0]),
        lora_bytes_per_layer=sum(
            p.numel() * p.element_size() for p in decoder.layers[0].parameters() if p.requires_grad
        ),
        embed_bytes=_tensor_bytes(decoder.embed_tokens),
        lm_head_bytes=_tensor_bytes(base_model.lm_head),
        per_seq=[layer | head for layer, head in zip(layers, heads, strict=True)],
        model_allocated_bytes=loaded,
    )


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))), flush=True)

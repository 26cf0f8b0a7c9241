"""FP32 attention in memory linear in the sequence: k and v expanded to every query head, then
SDPA's fused kernel (memory-efficient on CUDA, the fused CPU kernel on the CPU), asked for by name.

Why: with fp32 inputs and grouped-query heads (`enable_gqa`, what transformers asks for when no
mask is given), PyTorch's dispatcher refuses the memory-efficient kernel ("No available kernel")
and runs the math kernel, which keeps the heads x seq x seq probabilities for the backward: 4.11
GiB for one 70B-shaped layer at 2048 tokens, 64.9 GiB at 8192 (issue 38's table). Expanded k and
v cost 2 x seq x heads x head_dim floats per layer and let the fused kernel run: it keeps the
output and one log-sum-exp per head and row instead, and recomputes the probabilities in blocks
in the backward.

Registered with transformers' attention interface under `NAME` (no model file patched), with a
mask function beside it that builds the additive float mask once per forward, aligned as the
fused kernel wants it, so no layer converts or pads a mask of its own (each conversion would be
a seq x seq block kept per layer for the backward).

Families whose attention needs what the fused kernel lacks (Gemma 2's soft-capped scores) stay on
eager attention (`finetune_plan.families`); the trainer's self-check (`attention_choice.choose_attention`)
runs one forward and backward of this kernel at start and falls back, with the reason logged,
where the kernel is missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Final

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

# The `attn_implementation` name the trainer loads models with.
NAME: Final = "sdpa_expanded"
# The fused kernel's attention bias must have every stride but the last a multiple of 16
# elements (PyTorch pads, that is copies, a bias that is not, in every call).
MASK_ALIGNMENT: Final = 16


def backends(device: torch.device) -> list[SDPBackend]:
    """The one kernel asked for: memory-efficient on CUDA; on the CPU its fused kernel (PyTorch
    names it flash attention there), which also computes in fp32 without the matrix."""
    return [SDPBackend.EFFICIENT_ATTENTION] if device.type == "cuda" else [SDPBackend.FLASH_ATTENTION]


def expand_heads(states: torch.Tensor, groups: int) -> torch.Tensor:
    """(batch, kv_heads, seq, dim) to (batch, kv_heads * groups, seq, dim), each kv head repeated
    for its group of query heads (transformers' `repeat_kv`: the same order)."""
    if groups == 1:
        return states
    batch, kv_heads, seq, dim = states.shape
    return states[:, :, None].expand(batch, kv_heads, groups, seq, dim).reshape(batch, kv_heads * groups, seq, dim)


def fused_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    causal: bool,
    dropout: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """SDPA on the fused kernel alone: (batch, heads, seq, dim) in, the same out. Raises
    RuntimeError ("No available kernel") where the kernel cannot take these inputs, rather than
    quietly running the math kernel."""
    groups = query.shape[1] // key.shape[1]
    key, value = expand_heads(key, groups), expand_heads(value, groups)
    with sdpa_kernel(backends(query.device)):
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout, scale=scale, is_causal=causal
        )


def attention_forward(  # noqa: PLR0917 (transformers calls it with these positional arguments)
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: returns (batch, seq, heads, dim)."""
    if kwargs.get("softcap") is not None:
        raise ValueError(f"{NAME} attention cannot soft-cap scores; this family trains with eager attention")
    if kwargs.get("position_bias") is not None:
        raise ValueError(f"{NAME} attention takes no position bias; this family trains with eager attention")
    q_length = query.shape[2]
    causal = is_causal if is_causal is not None else bool(getattr(module, "is_causal", True))
    # A causal pattern with no padding reaches here as no mask at all (the mask function skips it).
    causal = causal and attention_mask is None and q_length > 1
    if causal and key.shape[2] > q_length:  # a prefill into an empty static cache
        key, value = key[:, :, :q_length], value[:, :, :q_length]
    mask = additive_mask(attention_mask, query.dtype)
    out = fused_attention(query, key, value, mask=mask, causal=causal, dropout=dropout, scale=scaling)
    # The kernel writes (batch, seq, heads, dim) and hands back a transposed view: this is no copy.
    return out.transpose(1, 2).contiguous(), None


def aligned_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True: attend) as the fused kernel's additive bias: 0 where allowed, the
    dtype's lowest value elsewhere (not -inf: a row with nothing allowed stays finite), in storage
    whose rows are padded to `MASK_ALIGNMENT` so the kernel takes it without copying."""
    width = allowed.shape[-1]
    padded = -(-width // MASK_ALIGNMENT) * MASK_ALIGNMENT
    storage = torch.zeros((*allowed.shape[:-1], padded), dtype=dtype, device=allowed.device)
    bias = storage[..., :width]
    bias.masked_fill_(~allowed, torch.finfo(dtype).min)
    return bias


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """The mask a layer hands the kernel: a float mask as it is (what `mask_function` builds); a
    boolean one (a 4D mask a caller built itself) converted here."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return aligned_mask(mask, dtype)


def mask_function(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """transformers' mask interface: SDPA's boolean mask (None where the pattern is plain causal,
    so the kernel runs its causal path), then the aligned additive bias once per forward."""
    from transformers.masking_utils import sdpa_mask

    dtype = kwargs.pop("dtype", torch.float32)
    mask = sdpa_mask(*args, **kwargs)
    if mask is None or mask.dtype != torch.bool:
        return mask
    return aligned_mask(mask, dtype)


def register() -> str:
    """Make `NAME` an `attn_implementation` transformers accepts (idempotent); returns it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, mask_function)
    return NAME


@contextlib.contextmanager
def math_only() -> Iterator[None]:
    """The math kernel alone, the reference the fused kernel is held to in tests."""
    with sdpa_kernel([SDPBackend.MATH]):
        yield

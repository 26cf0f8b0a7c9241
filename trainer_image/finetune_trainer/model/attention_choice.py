"""Which attention kernel the trainer runs, probed once at start on every device, and what the
planner plans for it.

It sits with the model's attention (`attention.py`), whose kernel the probe runs, so that
`hardware` never imports the model: the hardware says what the GPUs are, this says which kernel
runs on them.
"""

import logging
import os
from typing import Literal

import torch

from finetune_plan.memory import Attention as PlannedAttention

from ..hardware.capabilities import Hardware
from . import attention

log = logging.getLogger(__name__)

Attention = Literal["sdpa_expanded", "sdpa", "eager"]
ATTENTION_KERNELS: tuple[Attention, ...] = ("sdpa_expanded", "sdpa", "eager")


def _probe(device: torch.device, head_dim: int, dtype: torch.dtype, fused: bool) -> None:
    """One forward and backward at this head size and dtype, grouped-query heads (4 query heads
    on 2 kv heads), causal and with a padding mask; raises RuntimeError where the kernel is missing."""
    shape = (1, 4, 32, head_dim)
    q = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    kv = torch.randn((1, 2, 32, head_dim), device=device, dtype=dtype, requires_grad=True)
    allowed = torch.ones((1, 1, 32, 32), dtype=torch.bool, device=device).tril()
    allowed[..., 24:] = False
    for mask, causal in ((None, True), (attention.aligned_mask(allowed, dtype), False)):
        if fused:
            out = attention.fused_attention(q, kv, kv, mask=mask, causal=causal)
        else:
            out = torch.nn.functional.scaled_dot_product_attention(
                q, attention.expand_heads(kv, 2), attention.expand_heads(kv, 2), attn_mask=mask, is_causal=causal
            )
        # torch 2.7 leaves Tensor.backward unannotated.
        out.sum().backward()  # type: ignore[no-untyped-call]
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def choose_attention(hardware: Hardware, head_dim: int, dtype: torch.dtype) -> Attention:
    """The attention kernel, checked by one forward and backward on every device at start:
    - fp32: `sdpa_expanded` (k/v expanded to every head, SDPA's memory-efficient kernel by name;
      `finetune_trainer.model.attention`), memory linear in the sequence; where that kernel is missing,
      the reason logged, transformers' SDPA (for fp32 with grouped-query heads, the math kernel,
      which the planner plans as a materialised matrix); eager where SDPA fails too;
    - bf16 / fp16: transformers' SDPA (its flash kernel takes grouped-query heads as they are).
    A few milliseconds of probing beats a crash an hour in: SDPA's fp32 backward at head_dim 128
    has no P40 run on record. `FINETUNE_ATTENTION` forces one of the three."""
    forced = os.environ.get("FINETUNE_ATTENTION")
    if forced in ATTENTION_KERNELS:
        return forced
    devices = [torch.device("cpu")] if not hardware.on_gpu else [torch.device("cuda", g.index) for g in hardware.gpus]
    order: tuple[Attention, ...] = ("sdpa_expanded", "sdpa") if dtype == torch.float32 else ("sdpa",)
    for kernel in order:
        try:
            for device in devices:
                _probe(device, head_dim, dtype, fused=kernel == "sdpa_expanded")
        except RuntimeError as exc:
            log.warning(
                "attention self-check: %s failed at head_dim %d (%s); trying the next kernel", kernel, head_dim, exc
            )
            continue
        log.info(
            "attention self-check: %s passed a forward and backward at head_dim %d on %s",
            kernel,
            head_dim,
            ", ".join(map(str, devices)),
        )
        return kernel
    log.warning("attention self-check: no SDPA kernel ran; using eager attention")
    return "eager"


def planned_attention(kernel: Attention, dtype: torch.dtype) -> PlannedAttention:
    """What the planner plans for the kernel the trainer runs: the fused kernels keep no
    probabilities (`memory_efficient`); eager, and SDPA in fp32 with grouped-query heads (its
    math kernel), keep the heads x seq x seq matrix (`materialised`)."""
    if kernel == "sdpa_expanded" or (kernel == "sdpa" and dtype != torch.float32):
        return "memory_efficient"
    return "materialised"

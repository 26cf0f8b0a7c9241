"""FLOPs a QLoRA training step executes per token, for model-FLOPs utilisation (MFU).

Counted: every matrix product the step runs. The base weights are frozen, so the backward pass
computes input gradients only (2 FLOPs per weight per token, like the forward); gradient
checkpointing re-runs each decoder layer's forward once more. The lm_head is never
checkpointed. Attention scores are causal, so QK^T and AV cost half of the full square. LoRA
(rank 8: 0.1% of the weights), norms and the optimizer are left out; they make MFU a little
conservative. MFU = tokens/s per GPU x FLOPs per token / the FP32 matmul peak measured in the
same call (TF32 off).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    inter: int
    heads: int
    kv: int
    vocab: int

    @property
    def layer_weights(self) -> int:
        head_dim = self.hidden // self.heads
        attention = self.hidden * (2 * self.hidden + 2 * self.kv * head_dim)
        return attention + 3 * self.hidden * self.inter


def flops_per_token(shape: Shape, seq: int, checkpointing: bool) -> float:
    layer_linear = 2 * shape.layer_weights  # forward, per token
    layer_attention = 2 * seq * shape.hidden  # causal QK^T + AV, forward, per token
    head = 2 * shape.vocab * shape.hidden
    forward = shape.layers * (layer_linear + layer_attention) + head
    # backward: input grads of the frozen linears (1x forward), attention backward (2x forward)
    backward = shape.layers * (layer_linear + 2 * layer_attention) + head
    recompute = shape.layers * (layer_linear + layer_attention) if checkpointing else 0
    return float(forward + backward + recompute)


def mfu(tokens_per_s_per_gpu: float, shape: Shape, seq: int, checkpointing: bool, peak_tflops: float) -> float:
    return tokens_per_s_per_gpu * flops_per_token(shape, seq, checkpointing) / (peak_tflops * 1e12)

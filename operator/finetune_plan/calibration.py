"""The planner's measured constants, in one place so a new calibration changes one file.

`bench/calibration/fit.py` fits them to `bench/calibration/measurements.json` (peak memory and
tokens/s of real training steps with the recipe) and prints this file's new values;
`tests/planning/test_calibration.py` checks the planner against every measurement.

Until the grid is measured, the values come from a count of the tensors autograd keeps for a
Llama layer, checked against the two reference runs in the project brief (70B-shaped layers on
an H200, seq 2048: 15.2 GiB with checkpointing, 23.5 GiB without, 1848 and 2589 tokens/s).
"""

from typing import Final

# Floats kept per token by one decoder layer for backward when it is not checkpointed:
# about nine hidden-sized tensors (layer input, two norm outputs, q, repeated k and v, the
# attention output and its contiguous copy, the mid-layer residual) plus rope/upcast copies,
# and three intermediate-sized ones (gate, SiLU output, up).
ACTIVATION_HIDDEN_FLOATS: Final = 11.0
ACTIVATION_INTERMEDIATE_FLOATS: Final = 3.0
# Each adapted linear applies its own LoRA dropout: the dropped copy plus a one-byte mask.
DROPOUT_FLOATS_PER_INPUT: Final = 1.25
# FP32 attention with grouped-query heads runs SDPA's math path (or eager): the softmax
# probabilities (heads x seq x seq) are kept. A layer's backward holds more of them at once (the
# probabilities' gradient, the scores' gradient, the recomputed scores): at 4096 tokens and batch 2
# a run planned with one more copy asked for a fifth 4 GiB block beyond the cap
# (bench/results/2026-12-01-h200-boundary-sdpa.json's OOM, again with the loss in chunks). Three
# copies hold every measured point, 0 to 12 % over (bench/README.md, "The planner at its edge").
ATTENTION_MATRIX_COPIES_SAVED: Final = 1.0
ATTENTION_MATRIX_COPIES_BACKWARD: Final = 3.0
# SDPA with fp32 inputs and grouped-query heads runs PyTorch's math kernel, which keeps the
# probabilities as eager attention does: measured on an H200 (torch 2.11, transformers 5.24), the
# memory-efficient kernel refuses the call ("No available kernel") and the default's peak equals
# the math kernel's (7.35 GiB for one 70B-shaped layer at 2048 tokens, forward and backward, both
# ways). Planned as memory-efficient, shapes the planner said fit ran out of memory
# (bench/results/2026-12-01-h200-boundary.json: 4 of 7). So a plan keeps the matrix for fp32.
SDPA_FP32_KEEPS_MATRIX: Final = True
# Below this headroom (plus, for a whole-sequence loss, one block of seq x vocab floats) a plan
# takes the memory saver that keeps the math, the loss in chunks, when it fits: a whole-sequence
# loss planned with 0.2 GiB to spare asked for a 4 GiB logits block beyond the cap (8192 tokens of
# a 128k vocabulary; bench/results/2026-12-01-h200-boundary-sdpa.json, point 8b-s4096-b2-ckpt).
SHORT_HEADROOM_GIB: Final = 1.0
# Loss over the full sequence holds log-softmax output, its gradient and the logits'
# gradient at once (the trainer drops the model output's own logits before backward).
LOGITS_COPIES: Final = 3.0
# A soft-capped loss (Gemma 2, Gemma 3) keeps tanh's output for its backward: one block more.
# Planned without it, an 8-layer Gemma-2-9B-shaped slice at 2048 tokens measured 12.35 GiB against
# a plan of 11.01 (bench/results/2026-12-01-h200-families.json); the block is 1.95 GiB there.
SOFTCAP_SAVED_COPIES: Final = 1.0
# Backward of the MLP holds about two intermediate-sized gradients at once.
MLP_GRADIENT_FLOATS: Final = 2.0

# Speed, fitted by bench/calibration/fit.py to bench/calibration/measurements.json (H200,
# 2026-11-30, 15 points, each in its own process): share of the data-sheet FP32 peak the
# recipe's matmuls reach, share of
# the memory bandwidth NF4 dequantisation reaches, the fixed cost of running one decoder layer
# once (forward, backward or recompute: launching its kernels), and the hand-over between two
# GPUs in device_map mode, per micro-batch.
COMPUTE_UTILISATION: Final = 0.837
BANDWIDTH_UTILISATION: Final = 0.8
LAYER_PASS_SECONDS: Final = 0.00242
DEVICE_HOP_SECONDS: Final = 0.01082

# Per GPU, outside PyTorch's allocated bytes: the CUDA context and cuBLAS workspace, plus
# allocator fragmentation as a share of the allocated peak.
CUDA_CONTEXT_GIB: Final = 0.4
ALLOCATOR_SLACK: Final = 0.03

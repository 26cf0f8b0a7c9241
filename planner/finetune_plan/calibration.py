"""The planner's measured constants, in one place so a new calibration changes one file.

Memory: each part of a GPU's plan (what stays, the layers' activations, the backward's and the
loss's transients) is counted from the tensors the recipe keeps and set against the same part
measured by the trainer's phase probe on shallow slices (bench/results/2026-12-02-h200-parts.json);
whole runs of 3 to 40 layers, none of them used to set a constant but fsdp's three
(`FSDP_UNMEASURED_GIB`), judge the sum
(`bench/calibration/memory_fit.py`, bench/README.md). Speed: `bench/calibration/fit.py` fits the
constants to `bench/calibration/measurements.json` and `tests/planning/test_calibration.py`
checks the planner against every measurement.
"""

from typing import Final

# Floats kept per token by one decoder layer for backward when it is not checkpointed, counted
# from the tensors autograd keeps in a Llama layer under the recipe and measured part by part
# through the pod's command (bench/results/2026-12-02-h200-parts.json: 1.047 GiB per 8B-shaped
# layer at 2048 tokens, 0.547 of it the hidden- and intermediate-wide tensors below, the rest the
# attention probabilities; the 70B shape, twice as wide, measured twice that):
# - hidden-wide: the layer's input and the mid-layer residual (each norm keeps its input);
# - attention-wide (heads x head_dim): q, k and v as SDPA's math kernel keeps them for its
#   matmuls, k and v repeated to every head;
# - intermediate-wide: the gate (SiLU's input), SiLU's output and up (the product's inputs).
# The NF4 linears keep no input (their weight has no gradient); what the adapters keep of their
# inputs is counted in `memory.saved_storages`.
ACTIVATION_HIDDEN_FLOATS: Final = 2.0
ACTIVATION_ATTENTION_FLOATS: Final = 3.0
ACTIVATION_INTERMEDIATE_FLOATS: Final = 3.0
# Besides the layers: the last layer's output and the final norm's, handed to the loss (measured:
# 2 hidden-wide blocks at every point of the parts record).
ACTIVATION_OUTSIDE_LAYERS_HIDDEN: Final = 2.0
# Each adapted linear applies its own LoRA dropout: the dropped copy plus a one-byte mask, while
# the input the adapters shared is no longer kept (measured 2.6 hidden widths more per layer with
# dropout on q/k/v/o, counted 3).
DROPOUT_FLOATS_PER_INPUT: Final = 1.25
# FP32 attention with grouped-query heads runs SDPA's math path (or eager): each layer keeps its
# softmax probabilities (heads x seq x seq), one matrix (measured 1.0 in the parts record: the
# 8B shape's layer grew by 0.39 GiB from 512 x 4 to 2048 x 1 tokens, the matrix by 0.375).
ATTENTION_MATRIX_COPIES_SAVED: Final = 1.0
# The attention's backward holds three matrices at once (the probabilities, their gradient, the
# scores' gradient), after the MLP's backward has freed the MLP's intermediate-wide tensors and
# two hidden-wide ones (the mid-layer residual, the attention output the o adapter kept):
# measured 2.97 to 3.0 matrices on top of that at 2048 and 4096 tokens, both widths, with and
# without recompute (the parts record).
ATTENTION_MATRIX_COPIES_BACKWARD: Final = 3.0
MLP_FREED_HIDDEN_FLOATS: Final = 2.0
# The fused attention the trainer runs in fp32 (`finetune_trainer/model/attention.py`: k and v expanded
# to every query head, SDPA's memory-efficient kernel by name) keeps no probabilities. Besides q
# and the expanded k and v (`ACTIVATION_ATTENTION_FLOATS`) it keeps its output, one attention-wide
# block, which is the o adapter's input where that adapter keeps its input (no dropout), and one
# log-sum-exp per head and position (`memory.saved_storages`). Its backward holds the
# gradients of q, k and v (k and v expanded), the output's gradient and the kernel's fp32
# accumulator, attention-wide each, after the MLP's backward has freed what the MLP kept.
FUSED_ATTENTION_BACKWARD_FLOATS: Final = 5.0
# Its time: FLOPs of the causal half of the scores (forward: two matmuls; backward: the scores
# recomputed and four matmuls) at this share of the data-sheet FP32 peak, measured on one
# 70B-shaped attention, forward and backward, at 2048 to 8192 tokens
# (bench/results/2026-12-04-h200-attention.json).
FUSED_ATTENTION_UTILISATION: Final = 0.64
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
# The MLP's backward holds the dequantised weight of its largest linear and intermediate-wide
# gradients: 1.3 blocks measured beside the weight where that phase is the larger (512 tokens).
MLP_GRADIENT_FLOATS: Final = 1.5

# Speed, fitted by bench/calibration/speed_fit.py to runs of the pod's command (H200): the `fit`
# points of bench/results/2026-12-05-h200-heldout-fit.json (rank 64 on every linear, with and
# without dropout; multi-head attention with a 32k vocabulary at batch 2; kept, recomputed and
# offloaded layers), the long-sequence points of 2026-12-04 and the 6-layer 70B-shaped slice (12
# runs, each within 3.5 % after the fit), with the 15 points of bench/calibration/measurements.json
# (2026-11-30, within 15 %); the `heldout` points judge it (bench/README.md). The share
# of the data-sheet FP32 peak the recipe's matmuls reach, the share of the memory bandwidth NF4
# dequantisation reaches (measured apart, 2026-11-30), the fixed cost of running one decoder
# layer once (forward, backward or recompute: launching its kernels), the hand-over between two
# GPUs in device_map mode per micro-batch (2026-11-30), and the trainer's own fixed cost per
# optimizer step beyond the optimizer (the step's figures gathered and reported, the gradient
# clip, the phase probe's reads, the batch built on the host): 0.05 s, which the 2026-11-30 grid,
# timed by a harness of its own around forward, backward and optimizer, did not see, and which
# cost short slices up to 12 % of their speed against the plan.
# A LoRA adapter's memory traffic per token, in floats per unit of its linear's input and output
# widths, forward and backward, and per unit of input width under dropout: measured apart on the
# trainer's own modules (PEFT's LoRA layer on bitsandbytes' NF4 linear, FP32, TF32 off) over six
# Llama-shaped linears, ranks 8 and 64, dropout 0 and 0.1, 2048 and 4096 tokens, the matmuls'
# FLOPs taken off (`bench.calibration.lora_cost`; bench/results/2026-12-05-h100-lora-cost.json:
# median 9.4 % off each timing). `speed.adapter_seconds` says what they stand for.
ADAPTER_FORWARD_IN_FLOATS: Final = 1.35
ADAPTER_FORWARD_OUT_FLOATS: Final = 6.06
ADAPTER_FORWARD_DROPOUT_FLOATS: Final = 2.63
ADAPTER_BACKWARD_IN_FLOATS: Final = 4.72
ADAPTER_BACKWARD_OUT_FLOATS: Final = 3.81
ADAPTER_BACKWARD_DROPOUT_FLOATS: Final = 2.5
COMPUTE_UTILISATION: Final = 0.843
BANDWIDTH_UTILISATION: Final = 0.8
LAYER_PASS_SECONDS: Final = 0.00237
DEVICE_HOP_SECONDS: Final = 0.01079
STEP_SECONDS: Final = 0.0387

# fsdp holds more than its counted parts: the three fsdp runs on two GPUs (70B-shaped, 2048 tokens,
# checkpointing) measured 1.52, 0.30 and 0.95 GiB above their plans' allocated parts at 4, 32 and
# 40 layers (bench/calibration/memory-fit.json), in the loss's phase and in the backward's. The
# phase probe measures fsdp's parts, but no 2-GPU machine has been lent since it exists, so the
# term is planned as measured, in both transient phases, until the parts are.
FSDP_UNMEASURED_GIB: Final = 1.0

# Per GPU, outside PyTorch's allocated bytes: the CUDA context and cuBLAS workspace, plus
# allocator fragmentation as a share of the allocated peak.
CUDA_CONTEXT_GIB: Final = 0.4
ALLOCATOR_SLACK: Final = 0.03

"""`training.gradientCheckpointing: auto` and `training.activationOffload`: how many decoder layers
keep their activations on the GPU, and whether the rest go to host memory instead of recomputing.

Checkpointing every layer recomputes every forward in the backward (a quarter of the step for an
8B model at 2048 tokens); none at all does not fit a P40. `auto` keeps the activations of as many
layers as the memory the plan leaves holds, less the planner's margin (`cal.SHORT_HEADROOM_GIB`,
and with a whole-sequence loss one more seq x vocab block, as the search asks of any plan:
`Layout.leaves_margin`), and checkpoints the rest. The trainer keeps the model's last layers:
the backward runs them first and frees what they kept before the first recompute, so keeping
one layer or more costs no recompute temporaries (`memory.layer_pass_temporaries`).

The memory a layer keeps without checkpointing is `memory.full_layer_activation_bytes`, counted
from the tensors the recipe keeps and set against the trainer's own measurement of it (the phase
probe, bench/results/2026-12-02-h200-parts.json: 1.047 GiB per 8B-shaped layer at 2048 tokens,
planned 1.047). Whole runs judge the sum (`bench/calibration/memory-fit.json`): every committed
run through the pod's command within 4 % of its plan's allocated part, the `auto` ones with kept
and offloaded layers within 0.2 %.

Offload (`true`) moves the saved tensors of every layer not kept to pinned host memory in the
forward and back in the backward, in place of the recompute; the trainer starts each layer's
copy back while the backward is still at the layer after it (`finetune_trainer.memory.activations`).
`auto` turns it on where layers would still recompute, when the speed model says the copies
cost less than the recompute they replace (`speed.offload_stall_seconds`: what does not hide
under the neighbouring layers' compute), and as many layers as their pinned memory fits the
pod's host memory (`host.budget`).

The modules: `ask` reads the spec's words, `kept` sizes the layers kept, `offload` weighs
`activationOffload: auto`, `choice` decides for a plan that fits; `messages.activations` words
the reasons and `results.activations` holds the decision the trainer applies.
"""

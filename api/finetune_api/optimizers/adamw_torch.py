"""PyTorch's AdamW: two FP32 states per parameter."""

from finetune_api.optimizers import Optimizer, register

register(Optimizer("adamw_torch", 2 * 4, "finetune_trainer.training.optim:adamw_torch", "PyTorch's AdamW", order=40))

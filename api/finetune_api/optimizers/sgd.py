"""Plain SGD: no state."""

from finetune_api.optimizers import Optimizer, register

register(Optimizer("sgd", 0.0, "finetune_trainer.training.optim:sgd", "PyTorch's SGD, no momentum", order=60))

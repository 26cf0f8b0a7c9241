"""Transformers' Adafactor with a fixed learning rate: factored second moments, about half a
byte per parameter for the adapter's matrices."""

from finetune_api.optimizers import Optimizer, register

register(Optimizer("adafactor", 0.5, "finetune_trainer.training.optim:adafactor", "Transformers' Adafactor", order=50))

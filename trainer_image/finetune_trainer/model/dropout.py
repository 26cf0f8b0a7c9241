"""Dropout switched off for one forward that must be the same every time (the evaluation, the
sample answers after training), the rest of the model left as it is."""

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def dropout_off(model: nn.Module) -> Iterator[None]:
    """Dropout modules in eval mode, the rest of the model as it is (training, checkpointed)."""
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout) and m.training]
    for module in dropouts:
        module.eval()
    try:
        yield
    finally:
        for module in dropouts:
            module.train()


@contextmanager
def inference(model: nn.Module) -> Iterator[None]:
    """The model in eval mode (so the KV cache is kept), each module's own mode put back after."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training

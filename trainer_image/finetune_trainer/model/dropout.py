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

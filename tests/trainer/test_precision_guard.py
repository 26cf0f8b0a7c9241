"""The guard on plain torch modules: it finds planted half tensors by name and passes clean ones."""

import pytest
import torch
from torch import nn

from finetune_api.reasons import ExitReason
from finetune_trainer.failures import TrainerFailure
from finetune_trainer.model.precision_guard import (
    GuardReport,
    fail_if_half,
    recast_to_fp32,
    scan_tensors,
    watch_activations,
)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x))


def test_clean_fp32_model_passes() -> None:
    model = Block()
    report = GuardReport()
    scan_tensors(model, report)
    with watch_activations(model, report):
        model(torch.randn(2, 8))
    fail_if_half(report)
    assert report.clean and report.checked_activations == 3


def test_recast_fixes_trainable_weights_and_norms_only() -> None:
    model = Block().to(torch.bfloat16)
    model.proj.weight.requires_grad_(False)
    changed = recast_to_fp32(model)
    assert sorted(changed) == ["norm.bias", "norm.weight", "proj.bias"]
    assert model.proj.weight.dtype == torch.bfloat16  # frozen, not a norm: left for the scan to report


@pytest.mark.parametrize("where", ["parameter", "buffer", "activation"])
def test_planted_half_tensor_is_caught_by_name(where: str) -> None:
    model = Block()
    if where == "parameter":
        model.proj.weight.data = model.proj.weight.data.to(torch.float16)
    elif where == "buffer":
        model.norm.register_buffer("scale", torch.ones(1, dtype=torch.bfloat16))
    else:
        model.norm.register_forward_hook(lambda _m, _i, out: out.to(torch.bfloat16))
    report = GuardReport()
    with pytest.raises(TrainerFailure) as caught:
        # the order of the trainer: tensors before the first step, then the first step's activations
        scan_tensors(model, report)
        fail_if_half(report)
        with watch_activations(model, report):
            model(torch.randn(2, 8))
        fail_if_half(report)
    assert caught.value.reason == ExitReason.PrecisionViolation
    expected = {
        "parameter": "parameters: proj.weight (torch.float16)",
        "buffer": "buffers: norm.scale (torch.bfloat16)",
        "activation": "activations of modules: norm (torch.bfloat16), <model> (torch.bfloat16)",
    }[where]
    assert expected in caught.value.message

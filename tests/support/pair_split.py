"""Watching the pair split's passes (objectives.preference.Preference.split_loss_sum): every call
of `sequence_sums` recorded with whether gradients were on, so a test can hold each side's forward
with gradients to the sums of its forward without (the dropout masks restored between). Torch
only: the GPU machine runs it too."""

from typing import Any

import pytest
import torch


def record_sums(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, torch.Tensor]]:
    """(gradients on, the sums) of each `sequence_sums` call from now on, in order."""
    from finetune_trainer.objectives import preference

    seen: list[tuple[bool, torch.Tensor]] = []
    original = preference.sequence_sums

    def recorded(*args: Any) -> torch.Tensor:
        out = original(*args)
        seen.append((torch.is_grad_enabled(), out.detach().clone()))
        return out

    monkeypatch.setattr(preference, "sequence_sums", recorded)
    return seen


def policy_passes(seen: list[tuple[bool, torch.Tensor]]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The policy's two sides without gradients (the last two such calls: DPO's reference comes
    before them) and the two with gradients, each in the order chosen, rejected."""
    without = [sums for grad, sums in seen if not grad][-2:]
    with_grad = [sums for grad, sums in seen if grad]
    assert len(without) == 2 and len(with_grad) == 2, [grad for grad, _ in seen]
    return without, with_grad

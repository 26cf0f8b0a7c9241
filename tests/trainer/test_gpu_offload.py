"""The offload on a GPU: the copies out on a side stream, the copy back a layer ahead, and autograd
gets back, bit for bit, what it saved. The CPU tests (test_activations.py) cover the grouping,
one copy per storage and the prefetch order; only a GPU has streams, pinned memory and the
allocator's stream-ordered reuse, which these check.

Needs a GPU (skipped in CI, which has none); run on a GPU machine with
`python tests/trainer/test_gpu_offload.py` (no pytest needed there).
"""

import pytest
import torch
from torch import nn

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
LAYERS = 8
WIDTH = 2048
TOKENS = 4096


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x + self.down(nn.functional.silu(self.up(normed)))


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(_Block() for _ in range(LAYERS))).cuda().train()


def _step(model: nn.Module, x: torch.Tensor) -> tuple[list[torch.Tensor], int]:
    """Gradients of one step and the forward's peak allocated bytes above the step's start."""
    model.zero_grad(set_to_none=True)
    x.grad = None
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = model(x).square().mean()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - start
    loss.backward()
    assert x.grad is not None
    return [x.grad.clone(), *(p.grad.clone() for p in model.parameters() if p.grad is not None)], peak


@needs_gpu
def test_offloaded_gradients_are_bit_identical_and_the_activations_leave_the_gpu() -> None:
    from finetune_trainer.activations import Offloader

    x = torch.randn(TOKENS, WIDTH, device="cuda", requires_grad=True)
    plain_model = _model()
    plain, plain_peak = _step(plain_model, x)
    model = _model()
    offloader = Offloader()
    for index, block in enumerate(model):
        offloader.attach(block, first=index == 0)
    for _ in range(3):  # the pinned blocks and the side streams reused
        hooked, peak = _step(model, x)
        assert all(torch.equal(a, b) for a, b in zip(plain, hooked, strict=True))
    # Without offload the forward ends holding every block's saved tensors; with it, at most the
    # block running and the one crossing to the host (the throttle), and a block's temporaries.
    per_block = plain_peak / LAYERS
    assert peak <= 3.5 * per_block, (peak, plain_peak)
    assert all(slot.gpu is None for g in offloader.groups for slot in g.slots.values())
    print(
        f"gpu offload: peak {peak / 2**30:.2f} GiB against {plain_peak / 2**30:.2f} GiB "
        f"({per_block / 2**30:.2f} per block)"
    )


if __name__ == "__main__":
    test_offloaded_gradients_are_bit_identical_and_the_activations_leave_the_gpu()
    print("gpu_offload: bit-identical")

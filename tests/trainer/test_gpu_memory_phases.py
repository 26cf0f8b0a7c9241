"""The phase probe on a GPU: a step cut into resident, activations, loss and backward gives each
part exactly, and the run's peak, across the resets the cuts make, is the largest phase's.

Needs a GPU (skipped in CI, which has none: off the GPU the probe does nothing, and the allocator's
counters it reads exist only there); run on a GPU machine with
`python tests/trainer/test_gpu_memory_phases.py` (no pytest needed there).
"""

import pytest
import torch
from torch import nn

needs_gpu = pytest.mark.gpu  # skipped where no CUDA GPU is visible (tests/conftest.py)
LAYERS = 4
WIDTH = 1024
TOKENS = 2048
VOCAB = 8192


def _model() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    stack = nn.Sequential(*(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS))).cuda()
    return stack, nn.Linear(WIDTH, VOCAB, bias=False).cuda()


def _step(stack: nn.Module, head: nn.Module, probe: object | None) -> None:
    from finetune_trainer.model.loss_head import LossHead

    loss_head = LossHead(head, chunk_tokens=0)
    x = torch.randn(1, TOKENS, WIDTH, device="cuda")
    loss_head.labels = torch.randint(0, VOCAB, (1, TOKENS), device="cuda")
    if probe is not None:
        probe.forward_starts()  # type: ignore[attr-defined]
    loss_head.probe = probe  # type: ignore[assignment]
    total = loss_head(stack(x))
    loss_head.probe = None
    total.sum().backward()
    if probe is not None:
        probe.backward_done()  # type: ignore[attr-defined]


@needs_gpu
def test_each_part_is_measured_and_the_peak_is_the_largest_phase() -> None:
    from finetune_trainer.memory.phases import PhaseProbe

    device = torch.device("cuda", 0)
    stack, head = _model()
    # One step first, as the trainer's probe sees every step after its first: cuBLAS allocates its
    # workspace through PyTorch's allocator in the first matmul, which would land in the first
    # forward's activations (seen on an H200: 64 MiB measured where the layers keep 32).
    _step(stack, head, None)
    stack.zero_grad(set_to_none=True)
    head.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    probe = PhaseProbe(device)
    _step(stack, head, probe)
    parts = probe.parts
    hidden_bytes = TOKENS * WIDTH * 4
    logits_bytes = TOKENS * VOCAB * 4
    # Each Linear's output stays (the next one saves it as its input; the last goes to the head).
    assert parts["activations"] == LAYERS * hidden_bytes, parts
    # The loss holds the fp32 logits and their log-softmax at least, one block short of four.
    assert 2 * logits_bytes <= parts["loss"] < 4 * logits_bytes, parts
    assert parts["backward"] > 0, parts
    # The cuts reset the allocator's peak; the run's peak is still the largest phase's. (On the
    # product's runs the peak read this way equals the peak of the runs before the probe existed:
    # 11.34 GiB both, the 8B shape all-recompute, bench/results/2026-12-02-h200-recompute*.json.)
    after_forward = parts["resident"] + parts["activations"]
    largest = after_forward + max(parts["forward"], parts["loss"], parts["backward"])
    assert probe.peak_bytes() == max(parts["resident"], largest), (probe.peak_bytes(), parts)
    summary = probe.summary()
    assert summary is not None and set(summary) == {"resident", "activations", "forward", "loss", "backward"}


if __name__ == "__main__":
    test_each_part_is_measured_and_the_peak_is_the_largest_phase()
    print("memory phases on the GPU: ok")

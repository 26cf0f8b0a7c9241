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

needs_gpu = pytest.mark.gpu  # skipped where no CUDA GPU is visible (tests/conftest.py)
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
    from finetune_trainer.memory.activations import Offloader

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


@needs_gpu
def test_a_recomputing_layers_input_alone_crosses_and_the_gradients_are_bit_identical() -> None:
    """Checkpointed decoder layers with their inputs offloaded (issue 38): each layer's input,
    and nothing else, crosses to the host; the forward ends holding at most two of them, not one
    per layer; the gradients equal plain checkpointing's bit for bit."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from finetune_trainer.memory import activations

    config = LlamaConfig(
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=16,
        num_key_value_heads=4,
        vocab_size=256,
    )
    ids = torch.randint(0, 256, (1, TOKENS), device="cuda", generator=torch.Generator("cuda").manual_seed(0))

    def run(inputs: bool) -> tuple[list[torch.Tensor], int]:
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).float().cuda().train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        activations.apply(model, activations.LayerActivations(0, False, inputs))
        hidden = model.model.embed_tokens(ids).detach()
        held = 0
        for _ in range(2):  # the second forward reuses the pinned blocks and the side stream
            model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            start = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = hidden
            for layer in model.model.layers:
                out = layer(
                    out, position_embeddings=model.model.rotary_emb(out, torch.arange(TOKENS, device="cuda")[None])
                )
            torch.cuda.synchronize()
            held = torch.cuda.memory_allocated() - start
            out.square().mean().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        return grads, held

    plain, plain_held = run(False)
    moved, held = run(True)
    assert all(torch.equal(a, b) for a, b in zip(plain, moved, strict=True))
    per_input = TOKENS * WIDTH * 4
    # Plain: every layer's input and the output; offloaded: the output, the two inputs the
    # throttle lets cross at once, and one the allocator has not yet taken back from the copy.
    assert plain_held >= LAYERS * per_input and held <= 4 * per_input, (held, plain_held, per_input)
    print(f"gpu input offload: forward ends holding {held / 2**20:.0f} MiB against {plain_held / 2**20:.0f} MiB")


@needs_gpu
def test_a_partial_offload_trains_as_all_recompute_on_the_gpu() -> None:
    """The plan's partial offload (the pod's host memory holds only some layers), applied by the
    trainer to a Llama on the GPU: of six layers the last keeps, the three before it offload
    through pinned memory and streams, the first two recompute; the gradients are the
    all-checkpointed run's, bit for bit, and the peak is below keeping every layer's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from finetune_trainer.memory import activations

    config = LlamaConfig(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=6,
        num_attention_heads=16,
        num_key_value_heads=4,
        vocab_size=1000,
        # Eager attention: the fused kernel's backward sums in no fixed order, and bit-equality
        # is about the offload, not about attention.
        attn_implementation="eager",
    )
    ids = torch.randint(0, 1000, (1, 2048), generator=torch.Generator().manual_seed(0)).cuda()

    def run(layout: activations.LayerActivations) -> tuple[list[torch.Tensor], dict[str, int], int]:
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).float().cuda().train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        counts = activations.apply(model, layout)
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        model(input_ids=ids, labels=ids).loss.backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - start
        return [p.grad.clone() for p in model.parameters() if p.grad is not None], counts, peak

    plain, _, _ = run(activations.LayerActivations(0, False))
    mixed, counts, mixed_peak = run(activations.LayerActivations(1, True, False, 3))
    _, _, kept_peak = run(activations.LayerActivations(6, False))
    assert counts["recomputed"] == 2 and counts["offloaded"] == 3 and counts["kept"] == 1, counts
    assert all(torch.equal(a, b) for a, b in zip(plain, mixed, strict=True))
    assert mixed_peak < kept_peak, (mixed_peak, kept_peak)
    print(f"gpu partial offload: peak {mixed_peak / 2**20:.0f} MiB against {kept_peak / 2**20:.0f} MiB all kept")


if __name__ == "__main__":
    test_offloaded_gradients_are_bit_identical_and_the_activations_leave_the_gpu()
    print("gpu_offload: bit-identical")
    test_a_recomputing_layers_input_alone_crosses_and_the_gradients_are_bit_identical()
    print("gpu_offload: inputs, bit-identical")

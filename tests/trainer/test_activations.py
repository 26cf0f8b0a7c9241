"""Where activations live changes memory, not the result: the tiny model trained with some layers
keeping their activations (gradientCheckpointing auto), and with the others offloaded, ends on the
adapter of the run that checkpoints every layer; and the offload hooks give autograd back what it
saved. (On the CPU no plan sizes `auto`: `training.keptLayers` names the layers kept.)"""

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from finetune_plan import LayerLayout
from finetune_trainer.memory.activations import Offloader, stays
from tests.support.training import ADAPTER_TOLERANCE, max_difference

from .conftest import JobDir, make_job_dir

pytestmark = pytest.mark.trainer

STEPS = 6
# LoRA dropout on: a recomputed layer must draw the masks its first forward drew.
SPEC = {"training": {"maxSteps": STEPS, "batchSize": 2}, "checkpoints": {"everySteps": STEPS}}


def _adapter(job: JobDir) -> dict:
    from safetensors.torch import load_file

    return load_file(str(job.output / "adapter" / "adapter_model.safetensors"))


def _job(tmp_path: Path, tiny_assets: Path, name: str, training: dict, extra: dict | None = None) -> JobDir:
    (tmp_path / name).mkdir()
    job = make_job_dir(tmp_path / name, tiny_assets)
    job.spec_changes = {**SPEC, "training": {**SPEC["training"], **training}, **(extra or {})}
    return job


def _counts(stderr: str) -> dict[str, int]:
    found = re.findall(
        r"activations: \{'layers': (\d+), 'kept': (\d+), 'recomputed': (\d+), 'offloaded': (\d+)\}", stderr
    )
    assert found, stderr[-2000:]
    layers, kept, recomputed, offloaded = map(int, found[-1])
    return {"layers": layers, "kept": kept, "recomputed": recomputed, "offloaded": offloaded}


def test_keeping_and_offloading_layers_trains_the_all_checkpointed_adapter(tmp_path: Path, tiny_assets: Path) -> None:
    steady = _job(tmp_path, tiny_assets, "all", {"gradientCheckpointing": True})
    done = steady.run()
    assert done.code == 0, done.stderr[-3000:]
    assert _counts(done.stderr) == {"layers": 2, "kept": 0, "recomputed": 2, "offloaded": 0}

    mixed = _job(
        tmp_path, tiny_assets, "auto", {"gradientCheckpointing": "auto", "activationOffload": False, "keptLayers": 1}
    )
    done = mixed.run()
    assert done.code == 0, done.stderr[-3000:]
    assert _counts(done.stderr) == {"layers": 2, "kept": 1, "recomputed": 1, "offloaded": 0}
    assert max_difference(_adapter(mixed), _adapter(steady)) <= ADAPTER_TOLERANCE

    offloaded = _job(
        tmp_path, tiny_assets, "offload", {"gradientCheckpointing": "auto", "activationOffload": True, "keptLayers": 1}
    )
    done = offloaded.run()
    assert done.code == 0, done.stderr[-3000:]
    assert _counts(done.stderr) == {"layers": 2, "kept": 1, "recomputed": 0, "offloaded": 1}
    assert max_difference(_adapter(offloaded), _adapter(steady)) <= ADAPTER_TOLERANCE

    # The recomputing layers' inputs in host memory, as a plan that needs the room says (issue 38).
    inputs = _job(tmp_path, tiny_assets, "inputs", {"gradientCheckpointing": True, "activationOffload": "inputs"})
    done = inputs.run()
    assert done.code == 0, done.stderr[-3000:]
    assert _counts(done.stderr) == {"layers": 2, "kept": 0, "recomputed": 2, "offloaded": 0}
    assert "the inputs of 2 recomputing layers wait in pinned host memory" in done.stderr
    assert max_difference(_adapter(inputs), _adapter(steady)) <= ADAPTER_TOLERANCE


def test_two_fsdp_processes_keep_or_offload_a_layer_and_train_the_all_checkpointed_adapter(
    tmp_path: Path, tiny_assets: Path
) -> None:
    two = {"resources": {"gpus": 0, "cpu": "2", "processes": 2}}
    fsdp = {"parallelism": "fsdp"}
    steady = _job(tmp_path, tiny_assets, "all", {**fsdp, "gradientCheckpointing": True}, two)
    assert steady.run().code == 0
    mixed = _job(tmp_path, tiny_assets, "auto", {**fsdp, "gradientCheckpointing": "auto", "keptLayers": 1}, two)
    done = mixed.run()
    assert done.code == 0, done.stderr[-3000:]
    assert _counts(done.stderr)["kept"] == 1
    assert max_difference(_adapter(mixed), _adapter(steady)) <= ADAPTER_TOLERANCE
    moved = _job(
        tmp_path,
        tiny_assets,
        "offload",
        {**fsdp, "gradientCheckpointing": "auto", "activationOffload": True, "keptLayers": 1},
        two,
    )
    done = moved.run()
    assert done.code == 0, done.stderr[-3000:]
    assert _counts(done.stderr)["offloaded"] == 1
    assert max_difference(_adapter(moved), _adapter(steady)) <= ADAPTER_TOLERANCE


class _Block(nn.Module):
    """A decoder layer's habits in small: a norm that saves its input twice (for the square and
    for the product), a view of a saved tensor, a wide middle."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(256, 512)
        self.down = nn.Linear(512, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        middle = nn.functional.silu(self.up(normed))
        return x + self.down(middle.view(-1, 512) * middle.view(-1, 512).sigmoid()).view_as(x)


def _blocks() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(_Block() for _ in range(3))).train()


def _grads(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    x.grad = None
    model(x).square().sum().backward()
    assert x.grad is not None
    return [x.grad.clone(), *(p.grad.clone() for p in model.parameters() if p.grad is not None)]


def _saved_storage_bytes(model: nn.Sequential, x: torch.Tensor) -> int:
    """Bytes of the distinct storages each block saves that the offload moves, counted apart."""
    total = 0
    for block in model:
        seen: dict[int, torch.UntypedStorage] = {}  # held, so no address is reused meanwhile

        def pack(t: torch.Tensor, seen: dict[int, torch.UntypedStorage] = seen) -> torch.Tensor:
            if not stays(t):
                seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            x = block(x)
        total += sum(s.nbytes() for s in seen.values())
    return total


def test_the_offloader_hands_autograd_back_what_it_saved_one_copy_per_storage() -> None:
    """Same gradients as without offload, over two steps (the second forward starts new groups);
    each saved storage crosses once although the blocks save some twice (planted fault: one
    copy per saved tensor, so the copied bytes exceed the storages'); weights stay."""
    x = torch.randn(4, 16, 256, requires_grad=True)
    plain = _grads(_blocks(), x)
    model = _blocks()
    offloader = Offloader()
    for index, block in enumerate(model):
        offloader.attach(block, first=index == 0)
    for _ in range(2):
        hooked = _grads(model, x)
        assert all(torch.equal(a, b) for a, b in zip(plain, hooked, strict=True))
    assert len(offloader.groups) == 3
    expected = _saved_storage_bytes(_blocks(), x.detach().requires_grad_())
    assert offloader.copied_bytes == expected > 0
    moved = [slot for group in offloader.groups for slot in group.slots.values()]
    assert moved and all(slot.gpu is None and slot.uses == 0 for slot in moved)
    assert stays(model[0].up.weight) and stays(model[0].up.weight.t())


def test_the_backward_starts_bringing_back_the_next_layer_before_it_asks() -> None:
    """While the backward is at a layer, the layer before it (the backward's next) is already on
    its way back (planted fault: no prefetch, each group fetched only when first asked)."""
    model = _blocks()
    offloader = Offloader()
    for index, block in enumerate(model):
        offloader.attach(block, first=index == 0)
    fetches: list[tuple[int, int | None]] = []
    fetch = offloader.fetch

    def recording(group: Any) -> None:
        if not group.fetched:
            reached = offloader._reached  # the order is what this test is about
            fetches.append((group.index, None if reached is None else reached.index))
        fetch(group)

    offloader.fetch = recording  # type: ignore[method-assign]
    _grads(model, torch.randn(4, 16, 256, requires_grad=True))
    # The last layer is fetched when the backward reaches it; every other one while the
    # backward is still at the layer after it.
    assert fetches == [(2, 2), (1, 2), (0, 1)], fetches


def test_a_recomputing_layer_sends_only_its_input_to_the_host_and_trains_as_before() -> None:
    """transformers checkpoints a decoder layer's `forward`, so the offload hooks around the layer
    see only what the checkpoint saves: the layer's input. Exactly that crosses, once per layer,
    and the gradients are the plain checkpointed run's, bit for bit."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from finetune_trainer.memory import activations

    config = LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
    )
    # 2 x 64 tokens of 256 floats: 128 KiB per input, above what the offload leaves in place.
    ids = torch.randint(0, 100, (2, 64), generator=torch.Generator().manual_seed(0))

    def run(inputs: bool) -> tuple[list[torch.Tensor], Offloader | None]:
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).float().train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        attached: list[Offloader] = []
        original = activations.Offloader.attach

        def spy(self: Offloader, layer: nn.Module, first: bool) -> None:
            attached.append(self)
            original(self, layer, first)

        activations.Offloader.attach = spy  # type: ignore[method-assign]
        try:
            counts = activations.apply(model, activations.LayerActivations(0, False, inputs))
        finally:
            activations.Offloader.attach = original  # type: ignore[method-assign]
        assert counts["recomputed"] == 3 and counts["offloaded"] == 0
        model(input_ids=ids, labels=ids).loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None], attached[0] if attached else None

    plain, none = run(False)
    moved, offloader = run(True)
    assert none is None and offloader is not None
    assert len(offloader.groups) == 3
    assert offloader.copied_bytes == 3 * ids.numel() * config.hidden_size * 4  # each layer's input, once
    assert all(torch.equal(a, b) for a, b in zip(plain, moved, strict=True))


def test_where_the_host_holds_only_some_layers_those_before_the_kept_offload_and_the_first_recompute() -> None:
    """The plan's `offloaded_layers` below the layers not kept (the pod's host memory holds only
    those): of four layers, the last keeps, the two before it offload, the first recomputes; the
    gradients are the all-checkpointed run's, bit for bit."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from finetune_trainer.memory import activations

    config = LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
    )
    ids = torch.randint(0, 100, (2, 64), generator=torch.Generator().manual_seed(0))
    layout = activations.chosen(_spec(), LayerLayout(kept=1, recomputed=1, offloaded=2), 4)
    assert layout == activations.LayerActivations(1, True, False, 2) and layout.recomputed(4) == 1

    def run(layout: activations.LayerActivations | None) -> tuple[list[torch.Tensor], dict[str, int]]:
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).float().train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        counts = activations.apply(model, layout or activations.LayerActivations(0, False))
        flags = [layer.gradient_checkpointing for layer in activations.decoder_layers(model)]
        model(input_ids=ids, labels=ids).loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        return grads, {**counts, "first_recomputes": int(flags == [True, False, False, False])}

    plain, _ = run(None)
    mixed, counts = run(layout)
    assert counts == {"layers": 4, "kept": 1, "recomputed": 1, "offloaded": 2, "first_recomputes": 1}
    assert all(torch.equal(a, b) for a, b in zip(plain, mixed, strict=True))


def _spec() -> Any:
    from finetune_api.spec import FineTuneJobSpec

    return FineTuneJobSpec.model_validate(
        {
            "model": {"source": {"pvc": {"claimName": "m"}}},
            "dataset": {"source": {"pvc": {"claimName": "d", "path": "x.jsonl"}}, "format": "text"},
            "output": {"pvc": {"claimName": "o"}},
        }
    )

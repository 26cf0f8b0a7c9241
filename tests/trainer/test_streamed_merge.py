"""The streamed merge (merge_stream.py) writes what PEFT's merge_and_unload writes, and holds one
shard, never the whole model, in host memory."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from finetune_trainer.modes.checkpoint_files import files_of
from finetune_trainer.outputs.merge_stream import merge_folder

REPO = Path(__file__).resolve().parents[2]
# fp32 end to end: only the order of the additions differs from PEFT's.
MERGE_TOLERANCE = 1e-6
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _trained_adapter(base: Path, folder: Path, **lora: object) -> None:
    """A PEFT adapter whose B is not zero (as after training), saved the way the trainer saves it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, init_lora_weights=False, **lora)  # type: ignore[arg-type]
    get_peft_model(model, config).save_pretrained(str(folder))


def _peft_merged(base: Path, adapter: Path) -> dict[str, torch.Tensor]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    return {
        k: v.detach().clone()
        for k, v in PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().state_dict().items()
    }


def _read(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in files_of(folder):
        out.update(load_file(str(file)))
    return out


@pytest.mark.parametrize("shards", ["one", "several"])
@pytest.mark.parametrize("rslora", [False, True])
def test_the_streamed_merge_equals_peft_merge_and_unload(
    tiny_assets: Path, tmp_path: Path, shards: str, rslora: bool
) -> None:
    base = tiny_assets / "models" / "tiny-llama"
    if shards == "several":  # the same model in shards with an index, as large checkpoints come
        from transformers import AutoModelForCausalLM

        resharded = tmp_path / "base"
        AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).save_pretrained(
            str(resharded), max_shard_size="100KB"
        )
        base = resharded
        assert len(files_of(base)) > 3
    adapter = tmp_path / "adapter"
    _trained_adapter(base, adapter, use_rslora=rslora)
    changed = merge_folder(base, adapter, tmp_path / "merged")
    assert len(changed) == 2 * len(TARGETS)  # two decoder layers
    expected, got, before = _peft_merged(base, adapter), _read(tmp_path / "merged"), _read(base)
    assert set(got) == set(before)
    # The tied/untied head and every other weight: exactly as PEFT's merged model has them.
    for name, tensor in got.items():
        reference = expected[name]
        assert tensor.dtype == before[name].dtype and tensor.shape == reference.shape, name
        assert float((tensor - reference).abs().max()) <= MERGE_TOLERANCE, name
    assert any(float((got[n] - before[n]).abs().max()) > 1e-3 for n in changed), "the adapter changed nothing"
    assert json.loads((tmp_path / "merged" / "config.json").read_text()) == json.loads(
        (base / "config.json").read_text()
    )


def _big_model(folder: Path, layers: int, hidden: int, shard_layers: int) -> int:
    """A random checkpoint of `layers` Llama-shaped layers, `shard_layers` to a shard, and an
    adapter for it; returns the model's bytes. Written directly: no model class is needed."""
    folder.mkdir()
    weight_map: dict[str, str] = {}
    total = 0
    gen = torch.Generator().manual_seed(0)
    for first in range(0, layers, shard_layers):
        shard: dict[str, torch.Tensor] = {}
        for layer in range(first, min(layers, first + shard_layers)):
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                shard[f"model.layers.{layer}.self_attn.{proj}.weight"] = torch.randn(hidden, hidden, generator=gen)
            for proj in ("gate_proj", "up_proj", "down_proj"):
                shard[f"model.layers.{layer}.mlp.{proj}.weight"] = torch.randn(hidden, hidden, generator=gen)
        name = f"model-{first // shard_layers + 1:05d}.safetensors"
        save_file(shard, str(folder / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        total += sum(t.numel() * t.element_size() for t in shard.values())
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text("{}")
    adapter = folder.parent / "adapter"
    adapter.mkdir()
    pairs = {}
    for name in weight_map:
        module = "base_model.model." + name.removesuffix(".weight")
        pairs[f"{module}.lora_A.weight"] = torch.randn(8, hidden, generator=gen) * 0.01
        pairs[f"{module}.lora_B.weight"] = torch.randn(hidden, 8, generator=gen) * 0.01
    save_file(pairs, str(adapter / "adapter_model.safetensors"))
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16}))
    return total


PEAK_PROBE = textwrap.dedent(
    """
    import sys, threading, time
    from pathlib import Path
    import torch, safetensors.torch
    from finetune_trainer.outputs.merge_stream import merge_folder
    from finetune_trainer.hardware.host_memory import _anon_kib
    base_kib = _anon_kib()
    peak = [base_kib]
    done = threading.Event()
    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _anon_kib())
            time.sleep(0.002)
    threading.Thread(target=sample, daemon=True).start()
    merge_folder(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
    done.set()
    print((max(peak[0], _anon_kib()) - base_kib) * 1024)
    """
)


def test_the_streamed_merge_holds_about_one_shard_not_the_model(tmp_path: Path) -> None:
    hidden, shard_layers = 1024, 1
    model_bytes = _big_model(tmp_path / "base", layers=12, hidden=hidden, shard_layers=shard_layers)
    shard_bytes = shard_layers * 7 * hidden * hidden * 4
    # One output shard, its serialised copy while safetensors writes it, a layer's fp32 delta and
    # the adapter, with room for the allocator: measured +92 MiB on a 336 MiB model of 28 MiB shards.
    bound = 3 * shard_bytes + 32 * 2**20
    assert model_bytes > 2 * bound, (model_bytes, bound)
    result = subprocess.run(
        [sys.executable, "-c", PEAK_PROBE, str(tmp_path / "base"), str(tmp_path / "adapter"), str(tmp_path / "merged")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    grown = int(result.stdout.strip().splitlines()[-1])
    print(
        f"model {model_bytes / 2**20:.0f} MiB, shard {shard_bytes / 2**20:.0f} MiB, anon peak +{grown / 2**20:.0f} MiB"
    )
    assert grown < bound, f"anonymous peak grew {grown / 2**20:.0f} MiB, bound {bound / 2**20:.0f} MiB"
    assert len(files_of(tmp_path / "merged")) == 12

"""Packed rows train exactly what one-sample-per-step trains: no attention or label across samples."""

import pytest
import torch

from bench.packing import IGNORE, length_mix, pack, packed_row


def test_bins_fit_and_cover_every_sample() -> None:
    lengths = length_mix(200, 2048, seed=3)
    bins = pack(lengths, 2048)
    assert sorted(i for b in bins for i in b) == list(range(200))
    assert all(sum(lengths[i] for i in b) <= 2048 for b in bins)
    # Instruction-like mix: a few hundred tokens on average, so several samples share a row.
    assert 150 < sum(lengths) / len(lengths) < 600
    assert len(bins) < len(lengths) / 3


def test_first_token_of_each_sample_is_not_a_label() -> None:
    samples = [torch.tensor([5, 6, 7]), torch.tensor([8, 9]), torch.tensor([10, 11, 12, 13])]
    _ids, positions, labels = packed_row(samples)
    assert positions.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]
    assert [i for i, v in enumerate(labels[0].tolist()) if v == IGNORE] == [0, 3, 5]


def test_packed_loss_equals_the_samples_trained_one_by_one() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    model = LlamaForCausalLM(config).eval()
    model.config._attn_implementation = "sdpa"
    samples = [torch.randint(0, 128, (n,)) for n in (17, 40, 9, 30)]
    with torch.no_grad():
        ids, positions, labels = packed_row(samples)
        # use_cache=False as in training: with a cache, transformers ignores restarting positions.
        packed = model(input_ids=ids, position_ids=positions, labels=labels, use_cache=False).loss.item()
        total, count = 0.0, 0
        for s in samples:
            total += model(input_ids=s[None], labels=s[None]).loss.item() * (len(s) - 1)
            count += len(s) - 1
        # The same rows with positions running on (no restart) let attention cross samples.
        leaked = model(input_ids=ids, labels=labels, use_cache=False).loss.item()
    assert packed == pytest.approx(total / count, rel=1e-5)
    assert leaked != pytest.approx(total / count, rel=1e-5)

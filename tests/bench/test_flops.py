"""The FLOP count behind every MFU figure in bench/results."""

import pytest

from bench.flops import Shape, flops_per_token, mfu

SLICE = Shape(layers=4, hidden=8192, inter=28672, heads=64, kv=8, vocab=128256)


def test_layer_weights_of_a_70b_layer() -> None:
    # q and o: 8192x8192 each; k and v: 8192x1024 each (8 KV heads of 128); MLP: 3 x 8192x28672.
    assert SLICE.layer_weights == 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672


def test_checkpointing_adds_one_forward_of_the_layers_only() -> None:
    with_ckpt = flops_per_token(SLICE, 2048, True)
    without = flops_per_token(SLICE, 2048, False)
    layer_forward = 4 * (2 * SLICE.layer_weights + 2 * 2048 * 8192)
    assert with_ckpt - without == pytest.approx(layer_forward)


def test_brief_reference_run_is_about_nine_tenths_of_the_fp32_peak() -> None:
    # The brief: 1848 tokens/s on one H200 at 51.2 TFLOP/s FP32, "about 89%".
    assert 0.85 < mfu(1848, SLICE, 2048, True, 51.2) < 0.95


def test_mfu_scales_with_throughput() -> None:
    assert mfu(2000, SLICE, 2048, True, 50.0) == pytest.approx(2 * mfu(1000, SLICE, 2048, True, 50.0))

"""bench/trl_grpo.py on the CPU, on a tiny Llama-shaped slice and the prompts `bench.trainer_job`
writes for ours: the pinned TRL takes the GRPO block's settings under their names, generates
with its KV cache (one-token forwards, as our rollouts decode), one prompt's G completions per
optimizer step, and logs the reward and completion length of every step; no parameter is left
in half precision."""

import json
from pathlib import Path
from typing import Any

import pytest

from bench import grpo, trainer_job, trl_grpo

LENGTH, COMPLETION, VOCAB = 24, 8, 512


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tmp = tmp_path_factory.mktemp("trl-grpo")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(str(tmp / "slice"))
    extra = grpo.ours_extra(LENGTH, COMPLETION, steps=2, warm=1)
    trainer_job.prepare({"path": str(tmp / "slice"), "work": str(tmp / "w"), **extra})
    spec = {"work": str(tmp / "w"), "steps": 2, "warm": 1, "cpu": True}
    found: dict[str, Any] = trl_grpo.run({**spec, "trl": grpo.trl_settings(COMPLETION), "reward": grpo.REWARD})
    # The child prints one JSON line: the result is plain JSON.
    assert json.loads(json.dumps(found)) == found
    found["data"] = (Path(spec["work"]) / "data" / "train.jsonl").read_text()
    return found


def test_trl_runs_the_warm_up_and_the_timed_steps(result: dict[str, Any]) -> None:
    assert result["event"] == "trl-grpo" and result["device"] == "cpu"
    assert len(result["step_seconds"]) == 3 and result["steps"] == 2 and result["warm"] == 1
    assert result["prompts_per_step"] == 1
    assert result["prompts_s"] == pytest.approx(2 / sum(result["step_seconds"][1:]), rel=1e-2)


def test_trl_generates_with_its_kv_cache(result: dict[str, Any]) -> None:
    # Each step: one prefill of the prompt, then one-token forwards (up to C - 1 of them).
    decoding = result["decoding_forwards"]
    assert decoding["longer"] == 3 and 0 < decoding["one_token"] <= 3 * (COMPLETION - 1)


def test_trl_logs_each_steps_reward_and_length(result: dict[str, Any]) -> None:
    assert len(result["rewards"]) == 3 and all(0.0 <= r <= 1.0 for r in result["rewards"])
    assert len(result["completion_lengths"]) == 3 and all(0 < n <= COMPLETION for n in result["completion_lengths"])
    assert result["half_params"] == [] and result["loss_first"] is not None

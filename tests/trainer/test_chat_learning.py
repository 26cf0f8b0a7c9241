"""trainOn at work: a tiny Llama trained on chats whose user turns are random noise and whose
assistant turns follow a fixed rule, once with `trainOn: assistant` and once with `all`.

How it is measured: both runs train the same steps on the same data and seed, unquantised so the
evaluation sees exactly the weights trained. Every checkpoint's adapter (steps 10, 20, 30) is
loaded onto the base model here and scored on held-out chats (fresh noise, the same rule): the
mean next-token loss over the assistant's tokens (each reply and its `</s>`) and over the user's
noise, both located by their characters in the rendered text, not by the product's masks.
"""

import json
import random
import string
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.conftest import JobDir, Run, make_job_dir

pytestmark = pytest.mark.trainer

RULE = ("red green blue", "yellow black white")  # the assistant's first and second reply, always
STEPS = (10, 20, 30)
NOISE_LETTERS = string.ascii_lowercase


def noise(rng: random.Random) -> str:
    return " ".join("".join(rng.choice(NOISE_LETTERS) for _ in range(rng.randint(3, 7))) for _ in range(6))


def chats(count: int, seed: int) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    return [
        [
            {"role": "user", "content": noise(rng)},
            {"role": "assistant", "content": RULE[0]},
            {"role": "user", "content": noise(rng)},
            {"role": "assistant", "content": RULE[1]},
        ]
        for _ in range(count)
    ]


def train(root: Path, tiny_assets: Path, train_on: str) -> tuple[JobDir, Run]:
    root.mkdir()
    job = make_job_dir(root, tiny_assets)
    data = root / "chats"
    data.mkdir()
    (data / "chat.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats(96, seed=1)))
    job.spec_changes = {
        "dataset": {
            "source": {"pvc": {"claimName": "chats", "path": "chat.jsonl"}},
            "format": "messages",
            "trainOn": train_on,
        },
        "quantization": {"type": "none"},
        "checkpoints": {"everySteps": 10, "keep": 3},
    }
    run = job.run()
    assert run.code == 0, run.stderr[-3000:]
    return job, run


def spans(text: str, pieces: list[str]) -> list[tuple[int, int]]:
    out, at = [], 0
    for piece in pieces:
        start = text.index(piece, at)
        out.append((start, start + len(piece)))
        at = start + len(piece)
    return out


def scored_positions(tokenizer: Any, chat: list[dict[str, str]]) -> tuple[list[int], list[int], list[int]]:
    """Token ids, and the positions of the assistant's tokens and of the user's noise."""
    text = tokenizer.apply_chat_template(chat, tokenize=False)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    replies = spans(text, [m["content"] + tokenizer.eos_token for m in chat if m["role"] == "assistant"])
    users = spans(text, [m["content"] for m in chat if m["role"] == "user"])

    def inside(which: list[tuple[int, int]]) -> list[int]:
        return [i for i, (a, b) in enumerate(encoded["offset_mapping"]) if i and any(a < y and b > x for x, y in which)]

    return encoded["input_ids"], inside(replies), inside(users)


def losses(model_dir: Path, adapter: Path | None, held_out: list[list[dict[str, str]]]) -> tuple[float, float]:
    """Mean next-token loss over the assistant's tokens and over the user's noise."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    model.eval()
    sums = {"assistant": [0.0, 0], "noise": [0.0, 0]}
    with torch.no_grad():
        for chat in held_out:
            ids, assistant, users = scored_positions(tokenizer, chat)
            logits = model(torch.tensor([ids])).logits[0]
            nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="none")
            for name, positions in (("assistant", assistant), ("noise", users)):
                sums[name][0] += float(nll[[p - 1 for p in positions]].sum())
                sums[name][1] += len(positions)
    return sums["assistant"][0] / sums["assistant"][1], sums["noise"][0] / sums["noise"][1]


def test_assistant_only_learns_the_rule_as_fast_and_not_the_noise(tmp_path: Path, tiny_assets: Path) -> None:
    model_dir = tiny_assets / "models" / "tiny-llama"
    held_out = chats(16, seed=7)
    runs = {on: train(tmp_path / on, tiny_assets, on) for on in ("assistant", "all")}
    base = losses(model_dir, None, held_out)
    curves = {
        on: [losses(model_dir, job.checkpoints / f"checkpoint-{s}", held_out) for s in STEPS]
        for on, (job, _) in runs.items()
    }
    figures = {"base": base, **curves}
    print("assistant-token loss / noise loss, base then steps", STEPS, json.dumps(figures))
    for at in range(len(STEPS)):
        # The rule is learnt at least as fast with the loss on the assistant's turns alone.
        assert curves["assistant"][at][0] <= curves["all"][at][0] * 1.05 + 0.02, figures
    assert curves["assistant"][-1][0] < base[0] / 2, figures
    # The noise is learnt (its letters' distribution) only where it is a target.
    assert curves["all"][-1][1] < base[1] - 1.0, figures
    assert curves["assistant"][-1][1] > curves["all"][-1][1] + 1.0, figures
    assert min(loss for _, loss in curves["assistant"]) > base[1] - 0.5, figures

    for on, (job, run) in runs.items():
        summary = json.loads((job.output / "summary.json").read_text())
        last = run.of("progress")[-1]
        assert (last["tokens"], last["trainedTokens"]) == (summary["tokens"], summary["trainedTokens"])
        rows = summary["finalStep"] * 4  # batchSize 4, one process, no accumulation
        if on == "all":  # every token but each row's first is a target
            assert summary["trainedTokens"] == summary["tokens"] - rows
        else:
            assert 0 < summary["trainedTokens"] < summary["tokens"] / 2
    assistant_run = runs["assistant"][0]
    assert any(
        b"train/trained_tokens" in event.read_bytes()
        for event in (assistant_run.output / "tensorboard").rglob("events.out.tfevents.*")
    )

"""A tiny random-init Llama with a tokenizer trained here, plus a small learnable Alpaca set.

What the tests and `make demo` train: the whole recipe (NF4, fp32 compute, LoRA, paged 8-bit
AdamW, checkpoints) runs on a CPU in seconds, with no download of any kind.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

OPPOSITES = [
    ("hot", "cold"), ("big", "small"), ("fast", "slow"), ("up", "down"), ("light", "dark"),
    ("open", "closed"), ("early", "late"), ("happy", "sad"), ("full", "empty"), ("high", "low"),
    ("old", "new"), ("hard", "soft"), ("wet", "dry"), ("long", "short"), ("near", "far"),
    ("loud", "quiet"), ("rich", "poor"), ("thick", "thin"), ("strong", "weak"), ("clean", "dirty"),
]  # fmt: skip
ANIMALS = [("dog", "woof"), ("cat", "meow"), ("cow", "moo"), ("duck", "quack"), ("sheep", "baa"), ("owl", "hoot")]
COLOURS = ["red", "green", "blue", "yellow", "black", "white", "orange", "purple"]

LM_HEAD_STD = 0.15

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def alpaca_records(count: int = 256, seed: int = 0) -> list[dict[str, str]]:
    """Deterministic tasks a tiny model can learn in a few dozen steps: the loss must fall."""
    rng = random.Random(seed)
    out: list[dict[str, str]] = []
    for index in range(count):
        kind = index % 3
        if kind == 0:
            word, opposite = rng.choice(OPPOSITES)
            if rng.random() < 0.5:
                word, opposite = opposite, word
            out.append({"instruction": "Give the opposite of the word.", "input": word, "output": opposite})
        elif kind == 1:
            animal, sound = rng.choice(ANIMALS)
            out.append(
                {"instruction": f"What sound does a {animal} make?", "input": "", "output": f"A {animal} says {sound}."}
            )
        else:
            words = rng.sample(COLOURS, 3)
            out.append({"instruction": "Repeat the colours.", "input": " ".join(words), "output": ", ".join(words)})
    return out


def _corpus() -> list[str]:
    from ..data.formats import ALPACA_PROMPT_WITH_INPUT

    lines = [json.dumps(r) for r in alpaca_records(512, seed=1)]
    lines += [ALPACA_PROMPT_WITH_INPUT.format(**r) + r["output"] for r in alpaca_records(512, seed=2)]
    lines += ["<|user|> <|assistant|> <|system|> The quick brown fox jumps over the lazy dog."]
    return lines


def train_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_corpus(), trainer=trainer)
    bos = core.token_to_id("<s>")
    # Llama style: BOS in front of every sequence, EOS added by the trainer where an answer ends.
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    # transformers 5 leaves PreTrainedTokenizerFast.__init__ unannotated.
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def train_llama_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Llama 2's kind of tokenizer.json (BPE over `▁`-joined words with byte fallback): the kind
    llama.cpp's converter reads without a known pre-tokenizer hash, so a tiny model made with it
    converts to GGUF (a byte-level BPE trained here has a hash no converter knows)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    core = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    core.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    core.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size + len(byte_tokens), special_tokens=specials + byte_tokens, show_progress=False
    )
    core.train_from_iterator(_corpus(), trainer=trainer)
    bos = core.token_to_id("<s>")
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    # transformers 5 leaves PreTrainedTokenizerFast.__init__ unannotated.
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_tiny_model(
    folder: Path,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    vocab_size: int = 512,
    seed: int = 0,
    llama_tokenizer: bool = False,
) -> Path:
    """Write a random-init LlamaForCausalLM (float32 safetensors) and its tokenizer into `folder`
    (Llama 2's kind of tokenizer with `llama_tokenizer`, which llama.cpp's converter takes)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = train_llama_tokenizer(vocab_size) if llama_tokenizer else train_tokenizer(vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    # transformers 5 types PreTrainedModel.to through a decorator whose signature wants the model first.
    model = LlamaForCausalLM(config).to(torch.float32)  # type: ignore[arg-type]
    # A trained LM head has large weights; at the default init (std 0.02) the normalised hidden
    # state can move a logit by about 1, and the loss could never fall far below log(vocab).
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, LM_HEAD_STD)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    readable_by_all(folder)
    return folder


def readable_by_all(folder: Path) -> None:
    """Add read (and, for folders, search) for group and others: the shard writer makes
    model.safetensors 0600 through a temporary file, and the trainer that reads the folder from a
    claim runs as uid 1000, not as whoever made it."""
    for path in [folder, *folder.rglob("*")]:
        extra = 0o055 if path.is_dir() else 0o044
        path.chmod(path.stat().st_mode | extra)


def write_alpaca(path: Path, count: int = 256, seed: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for record in alpaca_records(count, seed):
            handle.write(json.dumps(record) + "\n")
    return path


def preference_records(count: int = 256, seed: int = 0, chat: bool = False) -> list[dict[str, Any]]:
    """Pairs with a rule a tiny model learns in a few dozen steps: the chosen answer is the
    right one (the opposite word, the animal's own sound), the rejected one a wrong one. As
    strings, or (`chat`) as messages rendered with the model's chat template."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for index in range(count):
        if index % 2 == 0:
            word, opposite = rng.choice(OPPOSITES)
            if rng.random() < 0.5:
                word, opposite = opposite, word
            prompt, chosen, rejected = f"The opposite of {word} is", f" {opposite}.", f" {word}."
        else:
            (animal, sound), (_, wrong) = rng.sample(ANIMALS, 2)
            prompt, chosen, rejected = (
                f"What does a {animal} say?",
                f" A {animal} says {sound}.",
                f" A {animal} says {wrong}.",
            )
        if chat:
            out.append(
                {
                    "prompt": [{"role": "user", "content": prompt}],
                    "chosen": [{"role": "assistant", "content": chosen.strip()}],
                    "rejected": [{"role": "assistant", "content": rejected.strip()}],
                }
            )
        else:
            out.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return out


def write_preference(path: Path, count: int = 256, seed: int = 0, chat: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for record in preference_records(count, seed, chat):
            handle.write(json.dumps(record) + "\n")
    return path


def prompt_records(count: int = 256, seed: int = 0, chat: bool = False) -> list[dict[str, Any]]:
    """Prompts for GRPO (`dataset.format: prompt`) with the field a reward checks: the animal's
    sound (`answer`). As strings, or (`chat`) as one user message each."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for _ in range(count):
        animal, sound = rng.choice(ANIMALS)
        prompt = f"What does a {animal} say?"
        out.append({"prompt": [{"role": "user", "content": prompt}] if chat else prompt, "answer": sound})
    return out


def write_prompts(path: Path, count: int = 256, seed: int = 0, chat: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for record in prompt_records(count, seed, chat):
            handle.write(json.dumps(record) + "\n")
    return path

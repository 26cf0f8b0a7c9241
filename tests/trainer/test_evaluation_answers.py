"""The greedy answers (outputs/samples.py, which the evaluation's generation takes) are the same
with transformers' KV cache as without it: the tiny model as the trainer holds it (LoRA on every
linear layer, the loss head in place of the LM head, the trainer's attention, gradient
checkpointing in training mode), answered with its adapter and without, from the same prompts.
And the cached answer leaves every module in the mode it found it in."""

from pathlib import Path

import pytest
import torch

from finetune_trainer.model import attention
from finetune_trainer.model.loss_head import install, logits_head
from finetune_trainer.outputs import samples

pytestmark = pytest.mark.trainer

PROMPTS = [
    "### Instruction:\nGive the opposite of the word.\n\n### Input:\nhot\n\n### Response:\n",
    "### Instruction:\nWhat sound does a cow make?\n\n### Response:\n",
    "### Instruction:\nRepeat the colours.\n\n### Input:\nred blue green\n\n### Response:\n",
]
NEW_TOKENS = 24


def test_cached_answers_equal_uncached_ones(tiny_assets: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tiny_assets / "models" / "tiny-llama"
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=attention.register())
    # A LoRA that is not zero at its start (PEFT's default B = 0 would answer as the base does).
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False, lora_dropout=0.05)
    model = get_peft_model(base, lora)
    head = install(model, 0)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    device, eos = torch.device("cpu"), tokenizer.eos_token_id
    modes = [m.training for m in model.modules()]
    with logits_head(head), samples.dropout_off(model):
        for prompt in PROMPTS:
            ids = tokenizer(prompt)["input_ids"]
            for adapter in (True, False):
                with model.disable_adapter() if not adapter else torch.enable_grad():
                    cached = samples._greedy(model, ids, NEW_TOKENS, eos, device, cached=True)
                    plain = samples._greedy(model, ids, NEW_TOKENS, eos, device, cached=False)
                assert cached == plain, (prompt, adapter)
                assert len(cached) > 3
    assert [m.training for m in model.modules()] == modes

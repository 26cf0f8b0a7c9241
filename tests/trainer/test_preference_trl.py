"""DPO and ORPO against TRL (the pinned 1.16.0): the same loss, LoRA gradients and reward figures.

On a tiny Llama with a LoRA adapter (dropout 0, its B matrices drawn non-zero so the policy is
not the reference), fp32 on the CPU, one micro-batch of pairs of different lengths (so the
padding is in play) is built from OUR pair rows (`pair_rows`, `Preference.collate`), with string
prompts and with messages through the chat template. Our side is the real objective
(`objectives.for_spec`) on the real LM head (`loss_head.install`), unchunked and in chunks of
tokens shorter than a sequence; TRL's side is its own trainer's code path on a second copy of
the same weights: `DPOTrainer._compute_loss` (its fused LM head, the adapter disabled for the
reference) and ORPO's `get_batch_loss_metrics` (`concatenated_forward`, `odds_ratio_loss`).

For one micro-batch, our loss (`loss_sum` over the step's pairs) is TRL's mean over the batch,
our figures (`step_metrics`) TRL's logged ones, and ORPO's cross-entropy (a mean over the
step's chosen tokens) TRL's mean over the chosen sequences' tokens.
"""

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from datasets import Dataset
from peft import get_peft_model
from transformers import AutoTokenizer
from trl import DPOConfig, DPOTrainer
from trl.experimental.orpo import ORPOConfig, ORPOTrainer

from finetune_api.resource import FineTuneJob
from finetune_trainer.data.tokens import IGNORE
from finetune_trainer.model.loss_head import LossHead, install
from finetune_trainer.model.tiny_model import make_tiny_model, preference_records
from finetune_trainer.objectives import TrainingObjective, for_spec
from finetune_trainer.objectives.preference import TRL_TAGS, Preference, pair_rows, sequence_sums
from tests.support.trl_side import base_model, lora_config

from .conftest import BASE_JOB

pytestmark = pytest.mark.trainer

TOLERANCE = 1e-5
# Shorter than every sequence of the batch: the head's per-sequence sums are taken across chunk
# borders that fall inside sequences.
CHUNK = 7
# Pairs in one micro-batch: the tiny model's opposites and animals, and two of lengths far apart.
PAIRS = 5

# The figures each objective reports, compared with TRL's under the trainer's own table of TRL's
# names (objectives/preference.py: TRL_TAGS, also its TensorBoard tags), so the table is held too.
FIGURES = ("rewardChosen", "rewardRejected", "rewardAccuracy", "rewardMargin", "logpChosen", "logpRejected")
ORPO_FIGURES = (*FIGURES, "nllLoss", "logOddsRatio", "logOddsChosen")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("trl") / "tiny-llama")


def adapter_weights(model: Any) -> dict[str, torch.Tensor]:
    """Every LoRA matrix drawn at N(0, 0.1): B non-zero, so the policy differs from the
    reference (PEFT starts B at zero, where every DPO log-ratio is 0)."""
    generator = torch.Generator().manual_seed(7)
    return {
        name: torch.randn(p.shape, generator=generator) * 0.1
        for name, p in sorted(model.named_parameters())
        if "lora_" in name
    }


def load_adapter(model: Any, weights: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)


def lora_grads(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if "lora_" in n and p.grad is not None}


def spec_for(method: str, settings: dict[str, Any]) -> Any:
    job = copy.deepcopy(BASE_JOB)
    job["spec"]["dataset"]["format"] = "preference"
    job["spec"]["training"].update({"method": method, method: settings})
    return FineTuneJob.model_validate(job).spec


def tokenizer_of(folder: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(folder))


def records(chat: bool) -> list[dict[str, Any]]:
    """The tiny model's pairs and two of lengths far apart, as strings or as messages."""
    pairs = preference_records(PAIRS - 2, seed=3)
    pairs += [
        {
            "prompt": "Repeat the colours: red green blue yellow black white orange purple.",
            "chosen": " red, green, blue, yellow, black, white, orange, purple.",
            "rejected": " red.",
        },
        {"prompt": "Say no.", "chosen": " No.", "rejected": " Yes, of course, whatever you ask, always and gladly."},
    ]
    if not chat:
        return pairs
    return [
        {
            "prompt": [{"role": "user", "content": p["prompt"]}],
            "chosen": [{"role": "assistant", "content": p["chosen"].strip()}],
            "rejected": [{"role": "assistant", "content": p["rejected"].strip()}],
        }
        for p in pairs
    ]


class Ours:
    """Our objective on our LM head, on its own copy of the model and adapter."""

    def __init__(self, folder: Path, weights: dict[str, torch.Tensor] | None, spec: Any) -> None:
        self.model = get_peft_model(base_model(folder), lora_config())
        load_adapter(self.model, adapter_weights(self.model) if weights is None else weights)
        self.model.train()
        self.head: LossHead = install(self.model, 0)
        self.objective: TrainingObjective = for_spec(spec)
        self.spec = spec

    def step(
        self, batch: dict[str, torch.Tensor], rows: list[Any], chunk: int
    ) -> tuple[float, dict[str, Any], dict[str, float]]:
        """The loop's one micro-batch step: loss, LoRA gradients, figures."""
        self.head.chunk_tokens = chunk
        self.model.zero_grad(set_to_none=True)
        totals = self.objective.counts(rows)
        self.objective.start_step()
        loss = self.objective.loss_sum(self.model, self.head, batch, totals) / totals[0]
        loss.backward()  # type: ignore[no-untyped-call]
        metrics = self.objective.step_metrics(float(loss), int(totals[0]), self.objective.sums)
        return float(loss), lora_grads(self.model), metrics


def our_batch(folder: Path, chat: bool, spec: Any) -> tuple[list[Any], dict[str, torch.Tensor]]:
    tokenizer = tokenizer_of(folder)
    rows = pair_rows(records(chat), tokenizer, spec.training.max_length)
    objective = for_spec(spec)
    assert isinstance(objective, Preference)
    batch = objective.collate(rows, tokenizer.pad_token_id, torch.device("cpu"), packed=False)
    # Padding in play: sequences of many lengths, the longest twice the shortest.
    widths = [len(r.chosen.input_ids) for r in rows] + [len(r.rejected.input_ids) for r in rows]
    assert len(set(widths)) > 3 and max(widths) >= 2 * min(widths), widths
    return rows, batch


def trl_args(config_class: Any, out: Path, **extra: Any) -> Any:
    return config_class(
        output_dir=str(out),
        per_device_train_batch_size=PAIRS,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        report_to="none",
        disable_dropout=True,
        seed=0,
        **extra,
    )


def trl_dataset() -> Any:
    return Dataset.from_list(records(chat=False))


def trl_trainer(trainer_class: Any, args: Any, folder: Path) -> tuple[Any, dict[str, torch.Tensor]]:
    """TRL's trainer on the tiny model with PEFT's own LoRA, its adapter set to moved weights
    (returned, for ours to load alike), in training mode."""
    trainer = trainer_class(
        model=base_model(folder),
        args=args,
        train_dataset=trl_dataset(),
        processing_class=tokenizer_of(folder),
        peft_config=lora_config(),
    )
    weights = adapter_weights(trainer.model)
    load_adapter(trainer.model, weights)
    trainer.model.train()
    return trainer, weights


def close(ours: float, theirs: float) -> bool:
    """Within TOLERANCE, absolute up to 1 and relative above: a summed log-probability of 80
    nats is held to fp32's last bits (its spacing there is 7.6e-6), not to 1e-5 absolute."""
    return abs(ours - theirs) <= TOLERANCE * max(1.0, abs(theirs))


def max_diff(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> tuple[float, float]:
    """The largest absolute gradient difference, and the largest one relative to its tensor's
    scale (its largest value, at least 1)."""
    assert ours.keys() == theirs.keys() and ours
    absolute = max(float((ours[n] - theirs[n]).abs().max()) for n in ours)
    relative = max(float((ours[n] - theirs[n]).abs().max() / theirs[n].abs().max().clamp(min=1.0)) for n in ours)
    return absolute, relative


def compare(
    what: str,
    ours: tuple[float, dict[str, torch.Tensor], dict[str, float]],
    loss: float,
    grads: dict[str, torch.Tensor],
    metrics: dict[str, float],
    names: tuple[str, ...],
) -> None:
    our_loss, our_grads, our_metrics = ours
    absolute, relative = max_diff(our_grads, grads)
    figures = {name: f"{abs(our_metrics[name] - metrics[TRL_TAGS[name]]):.1e}" for name in names}
    print(
        f"{what}: loss {our_loss:.6f} vs {loss:.6f} (|d| {abs(our_loss - loss):.2e}); grads max |d| {absolute:.2e} "
        f"(relative {relative:.2e}); figures |d| {figures}"
    )
    assert close(our_loss, loss), (what, our_loss, loss)
    assert relative <= TOLERANCE, (what, absolute, relative)
    for name in names:
        trl = TRL_TAGS[name]
        assert close(our_metrics[name], metrics[trl]), (what, name, our_metrics[name], metrics[trl])


@pytest.mark.parametrize("chat", [False, True], ids=["strings", "messages"])
@pytest.mark.parametrize(("loss_type", "beta"), [("sigmoid", 0.1), ("ipo", 0.5)])
def test_dpo_matches_trl(tiny: Path, tmp_path: Path, loss_type: str, beta: float, chat: bool) -> None:
    spec = spec_for("dpo", {"beta": beta, "lossType": loss_type})
    rows, batch = our_batch(tiny, chat, spec)
    args = trl_args(DPOConfig, tmp_path, beta=beta, loss_type=[loss_type], max_length=None)
    trainer, weights = trl_trainer(DPOTrainer, args, tiny)
    inputs = {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        # The answers' tokens: what our labels hold (the prompt and the padding are IGNORE).
        "completion_mask": (batch["labels"] != IGNORE).long(),
    }
    loss = trainer._compute_loss(trainer.model, inputs, return_outputs=False)
    loss.backward()
    metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    assert abs(metrics["rewards/margins"]) > 1e-3, metrics  # the adapter moved the policy off the reference
    theirs = float(loss), lora_grads(trainer.model), metrics

    ours = Ours(tiny, weights, spec)
    for chunk in (0, CHUNK):
        compare(f"dpo {loss_type} chat={chat} chunk={chunk}", ours.step(batch, rows, chunk), *theirs, FIGURES)


@pytest.mark.parametrize("chat", [False, True], ids=["strings", "messages"])
def test_orpo_matches_trl(tiny: Path, tmp_path: Path, chat: bool) -> None:
    beta = 0.2
    spec = spec_for("orpo", {"beta": beta})
    rows, batch = our_batch(tiny, chat, spec)
    args = trl_args(ORPOConfig, tmp_path, beta=beta, max_length=spec.training.max_length)
    trainer, weights = trl_trainer(ORPOTrainer, args, tiny)
    count = len(rows)
    # TRL's ORPO batch: each side's ids, mask and labels (the prompt IGNORE), padded alike.
    inputs: dict[str, torch.Tensor] = {}
    for side, part in (("chosen", slice(0, count)), ("rejected", slice(count, 2 * count))):
        inputs[f"{side}_input_ids"] = batch["input_ids"][part]
        inputs[f"{side}_attention_mask"] = batch["attention_mask"][part]
        inputs[f"{side}_labels"] = batch["labels"][part]
    loss, metrics = trainer.get_batch_loss_metrics(trainer.model, inputs, train_eval="train")
    loss.backward()
    theirs = float(loss), lora_grads(trainer.model), metrics

    ours = Ours(tiny, weights, spec)
    for chunk in (0, CHUNK):
        compare(f"orpo chat={chat} chunk={chunk}", ours.step(batch, rows, chunk), *theirs, ORPO_FIGURES)


def test_chunked_head_gives_the_unchunked_sums(tiny: Path) -> None:
    """The head's per-sequence sums, and their gradients, alike in chunks shorter than a sequence
    (chunk borders inside sequences and across them) and whole."""
    spec = spec_for("orpo", {"beta": 0.1})
    rows, batch = our_batch(tiny, chat=False, spec=spec)
    ours = Ours(tiny, None, spec)
    answers = (batch["labels"][:, 1:] != IGNORE).float()
    every = (batch["targets"][:, 1:] != IGNORE).float()
    masks = torch.stack([answers, every])
    results = []
    for chunk in (0, 3, CHUNK, 64):
        ours.model.zero_grad(set_to_none=True)
        ours.head.chunk_tokens = chunk
        sums = sequence_sums(ours.model, ours.head, batch, masks)
        weights = torch.arange(1.0, sums.numel() + 1.0).reshape(sums.shape)
        (sums * weights).sum().backward()
        results.append((chunk, sums.detach(), lora_grads(ours.model)))
    whole_chunk, whole, whole_grads = results[0]
    assert whole.shape == (2, 2 * len(rows)) and bool((whole[1] > whole[0]).all())
    for chunk, sums, grads in results[1:]:
        difference = float((sums - whole).abs().max())
        absolute, relative = max_diff(grads, whole_grads)
        print(
            f"chunk {chunk} vs {whole_chunk}: sums max |d| {difference:.2e}, grads max |d| {absolute:.2e} "
            f"(relative {relative:.2e})"
        )
        assert all(close(a, b) for a, b in zip(sums.flatten().tolist(), whole.flatten().tolist(), strict=True)), (
            chunk,
            difference,
        )
        assert relative <= TOLERANCE, (chunk, relative)

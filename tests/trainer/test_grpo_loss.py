"""GRPO's loss against TRL (the pinned 1.16.0): the same advantages, log-probabilities, loss,
LoRA gradients and logged KL and clip figures, for each loss type offered.

TRL's side is its own trainer's code path: a `GRPOTrainer` on the tiny Llama with PEFT's LoRA
(dropout 0, its B matrices drawn non-zero so the policy is not the reference), fp32 on the CPU,
`use_vllm=False`. Its `_generate_and_score_completions` samples the completions, scores them with
a reward function the test writes (one prompt's group with equal rewards, so the zero-spread
guard is in play), and returns the advantages and, where it keeps them, the old policy's and the
reference's log-probabilities; its `_compute_loss` gives the loss and the figures. The
completions are then cut to different lengths (the padding in play, as completions that ended
early), and for more than one iteration the adapter is moved before the loss, as an optimizer
step between two iterations would, so the old policy differs from the current one and the ratio
is clipped on both sides.

Our side is objectives/grpo/loss.py on a second copy of the same weights: `per_token_logps` on
the model's logits (the policy; the old policy with the earlier weights; the reference with the
adapter off), `advantages` on the rewards TRL's reward function returned, `grpo_loss` on those.
"""

import re
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from datasets import Dataset
from peft import get_peft_model
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from finetune_trainer.model.tiny_model import make_tiny_model
from finetune_trainer.objectives.grpo import GrpoSettings
from finetune_trainer.objectives.grpo.loss import (
    CLIP_HIGH,
    CLIP_HIGH_MAX,
    CLIP_LOW,
    CLIP_LOW_MIN,
    CLIP_REGION,
    KL,
    advantages,
    grpo_loss,
    per_token_logps,
)
from tests.support.trl_side import base_model, lora_config

pytestmark = pytest.mark.trainer

TOLERANCE = 1e-5
GROUP = 4
COMPLETION = 6
TEMPERATURE = 0.7  # not 1: the temperature is in every log-probability
# Three prompts of different lengths (the prompts' left padding in play); `kind` picks the rewards.
PROMPTS = [
    {"prompt": "Name three colours:", "kind": "spread"},
    {"prompt": "Count from one to ten, slowly and in order please:", "kind": "equal"},
    {"prompt": "Say yes.", "kind": "fraction"},
]


class Case(NamedTuple):
    loss_type: str
    beta: float
    iterations: int
    scale: str
    epsilon_high: float | None = None
    bias_correction: bool = True


CASES = [
    *(Case(loss_type, 0.0, 1, "group") for loss_type in ("grpo", "dr_grpo", "dapo", "bnpo")),
    Case("grpo", 0.04, 2, "batch", 0.28),
    Case("dr_grpo", 0.04, 2, "none", 0.28),
    Case("dapo", 0.04, 2, "group", 0.28),
    Case("bnpo", 0.04, 2, "batch"),
    Case("dapo", 0.04, 1, "none"),
    Case("dapo", 0.1, 3, "group", 0.28, bias_correction=False),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("grpo") / "tiny-llama")


def adapter_weights(model: Any, seed: int, scale: float) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(p.shape, generator=generator) * scale
        for name, p in sorted(model.named_parameters())
        if "lora_" in name
    }


def moved(weights: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """The adapter after a step: each matrix moved by noise at a third of its scale (enough for
    some ratios to leave [1 - epsilon, 1 + epsilon_high] on each side)."""
    generator = torch.Generator().manual_seed(seed)
    return {name: value + torch.randn(value.shape, generator=generator) * 0.035 for name, value in weights.items()}


def load_adapter(model: Any, weights: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)


def lora_grads(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if "lora_" in n and p.grad is not None}


def scores(completion_ids: list[list[int]], kind: list[str], **_: Any) -> list[float]:
    """Rewards read off the completions: spread out, all equal, or fractions."""
    out = []
    for ids, what in zip(completion_ids, kind, strict=True):
        if what == "spread":
            out.append(float(sum(ids) % 7))
        elif what == "equal":
            out.append(1.0)
        else:
            out.append(len(set(ids)) / (1.0 + ids[0] % 3))
    return out


class Rewarded:
    """The reward function TRL calls, keeping what it returned for our side."""

    def __init__(self) -> None:
        self.rewards: list[float] = []
        self.__name__ = "scores"

    def __call__(self, completion_ids: list[list[int]], kind: list[str], **rest: Any) -> list[float | None]:
        self.rewards = scores(completion_ids, kind)
        return list(self.rewards)


def trl_trainer(folder: Path, out: Path, case: Case, reward: Rewarded) -> Any:
    args = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=GROUP * len(PROMPTS),
        num_generations=GROUP,
        max_completion_length=COMPLETION,
        temperature=TEMPERATURE,
        beta=case.beta,
        num_iterations=case.iterations,
        epsilon=0.2,
        epsilon_high=case.epsilon_high,
        loss_type=case.loss_type,
        scale_rewards=case.scale,
        use_bias_correction_kl=case.bias_correction,
        use_vllm=False,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        report_to="none",
        disable_dropout=True,
        seed=0,
    )
    return GRPOTrainer(
        model=base_model(folder),
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(PROMPTS),
        processing_class=AutoTokenizer.from_pretrained(str(folder)),
        peft_config=lora_config(),
    )


def cut(batch: dict[str, Any], pad_id: int) -> None:
    """Completions of different lengths, as if some ended early: row i keeps COMPLETION - i % 4
    tokens, its padding the pad token with mask 0 (the completions run to the cap on a random
    tiny model). The kept tokens attend to nothing after them, so their log-probabilities are
    the ones TRL computed."""
    for row in range(batch["completion_ids"].shape[0]):
        keep = COMPLETION - row % 4
        batch["completion_ids"][row, keep:] = pad_id
        batch["completion_mask"][row, keep:] = 0
    batch["num_items_in_batch"] = batch["completion_mask"].sum()


class Ours:
    """The loss module on its own copy of the model and adapter, logits from a plain forward."""

    def __init__(self, folder: Path, batch: dict[str, Any]) -> None:
        self.model = get_peft_model(base_model(folder), lora_config())
        self.model.train()
        self.ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        self.attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        self.completion_ids = batch["completion_ids"]

    def logps(self) -> torch.Tensor:
        width = self.completion_ids.shape[1]
        logits = self.model(input_ids=self.ids, attention_mask=self.attention).logits
        return per_token_logps(logits[:, -width - 1 : -1], self.completion_ids, TEMPERATURE)

    def reference(self) -> torch.Tensor:
        with torch.no_grad(), self.model.disable_adapter():
            return self.logps()


def close(ours: float, theirs: float) -> bool:
    return abs(ours - theirs) <= TOLERANCE * max(1.0, abs(theirs))


def masked_max(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float(((a - b) * mask).abs().max())


def relative_grad_diff(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> float:
    assert ours.keys() == theirs.keys() and ours
    return max(float((ours[n] - theirs[n]).abs().max() / theirs[n].abs().max().clamp(min=1.0)) for n in ours)


def settings_for(case: Case) -> GrpoSettings:
    return GrpoSettings(
        num_generations=GROUP,
        max_completion_length=COMPLETION,
        temperature=TEMPERATURE,
        beta=case.beta,
        epsilon=0.2,
        epsilon_high=case.epsilon_high,
        num_iterations=case.iterations,
        loss_type=case.loss_type,  # type: ignore[arg-type]
        scale_rewards=case.scale,  # type: ignore[arg-type]
        use_bias_correction_kl=case.bias_correction,
    )


def trl_side(tiny: Path, tmp_path: Path, case: Case) -> tuple[Any, dict[str, Any], list[float], list[dict[str, Any]]]:
    """TRL's rollouts and loss: the batch, its rewards, the adapter weights (sampling, then
    current), and its loss, gradients and figures."""
    reward = Rewarded()
    trainer = trl_trainer(tiny, tmp_path, case, reward)
    sampling = adapter_weights(trainer.model, seed=7, scale=0.1)
    load_adapter(trainer.model, sampling)
    trainer.model.train()
    torch.manual_seed(0)
    batch = trainer._generate_and_score_completions([dict(p) for p in PROMPTS for _ in range(GROUP)])
    assert ("old_per_token_logps" in batch) == (case.iterations > 1)
    assert ("ref_per_token_logps" in batch) == (case.beta != 0.0)
    cut(batch, trainer.processing_class.pad_token_id)
    current = moved(sampling, seed=11) if case.iterations > 1 else sampling
    load_adapter(trainer.model, current)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which does not run here
    loss = trainer._compute_loss(trainer.model, batch)
    loss.backward()
    metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    theirs = {"loss": float(loss), "grads": lora_grads(trainer.model), "metrics": metrics}
    return batch, theirs, reward.rewards, [sampling, current]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.loss_type}-beta{c.beta}-mu{c.iterations}-{c.scale}")
def test_grpo_loss_matches_trl(tiny: Path, tmp_path: Path, case: Case) -> None:
    batch, theirs, rewards, (sampling, current) = trl_side(tiny, tmp_path, case)
    mask = batch["completion_mask"].float()
    lengths = mask.sum(-1)
    assert len(set(lengths.tolist())) > 1 and len(set(rewards)) > 2, (lengths, rewards)

    ours = Ours(tiny, batch)
    settings = settings_for(case)
    ours_adv = advantages(torch.tensor(rewards, dtype=torch.float32), GROUP, settings.scale_rewards)
    assert float((ours_adv - batch["advantages"]).abs().max()) <= TOLERANCE, (ours_adv, batch["advantages"])
    assert bool((batch["advantages"][GROUP : 2 * GROUP] == 0).all())  # the equal group: the floor, no NaN

    old = None
    if case.iterations > 1:
        load_adapter(ours.model, sampling)
        with torch.no_grad():
            old = ours.logps()
        assert masked_max(old, batch["old_per_token_logps"], mask) <= TOLERANCE
    load_adapter(ours.model, current)
    ref = ours.reference() if case.beta != 0.0 else None
    if ref is not None:
        assert masked_max(ref, batch["ref_per_token_logps"], mask) <= TOLERANCE
    ours.model.zero_grad(set_to_none=True)
    logps = ours.logps()
    items = float(batch["num_items_in_batch"])
    loss, figures = grpo_loss(logps, old, ref, ours_adv, batch["completion_mask"], settings=settings, num_items=items)
    loss.backward()  # type: ignore[no-untyped-call]

    metrics = theirs["metrics"]
    names = [CLIP_LOW, CLIP_HIGH, CLIP_REGION, CLIP_LOW_MIN, CLIP_HIGH_MAX] + ([KL] if case.beta else [])
    relative = relative_grad_diff(lora_grads(ours.model), theirs["grads"])
    print(
        f"{case}: loss {float(loss):.7f} vs {theirs['loss']:.7f}; grads relative |d| {relative:.1e}; "
        + ", ".join(f"{n} {figures[n]:.4f}/{metrics[n]:.4f}" for n in names)
    )
    assert close(float(loss), theirs["loss"]), (float(loss), theirs["loss"])
    assert relative <= TOLERANCE, relative
    assert set(figures) == set(names)
    assert (KL in metrics) == bool(case.beta)  # TRL logs the KL only where beta is set
    for name in names:
        assert close(figures[name], metrics[name]), (name, figures[name], metrics[name])
    if case.iterations > 1:  # the moved adapter: clipped on both sides, so the clip is held too
        assert metrics[CLIP_LOW] > 0 and metrics[CLIP_HIGH] > 0, metrics
    if case.beta:
        assert metrics[KL] > 1e-4, metrics  # the adapter moved the policy off the reference


def test_half_precision_is_refused_in_one_line() -> None:
    logps = torch.zeros(2, 3, dtype=torch.float16)
    line = "GRPO loss: logps is torch.float16, the trainer computes it in float32 only"
    with pytest.raises(TypeError, match=f"^{re.escape(line)}$"):
        grpo_loss(logps, None, None, torch.zeros(2), torch.ones(2, 3), settings=GrpoSettings())
    with pytest.raises(TypeError, match=r"logits is torch\.bfloat16"):
        per_token_logps(torch.zeros(2, 3, 5, dtype=torch.bfloat16), torch.zeros(2, 3, dtype=torch.long), 1.0)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_generations", 1, "training.grpo.numGenerations: 1, at least 2"),
        ("top_p", 0.0, "training.grpo.topP: 0.0, must be in (0, 1]"),
        ("temperature", 0.0, "training.grpo.temperature: 0.0, must be above 0"),
        ("num_iterations", 0, "training.grpo.numIterations: 0, at least 1"),
    ],
)
def test_settings_refuse_what_trl_refuses(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        changed: dict[str, Any] = {field: value}
        GrpoSettings(**changed)


def test_settings_defaults_are_trls(tmp_path: Path) -> None:
    """Where a setting is also TRL's, its default is TRL's (maxCompletionLength aside: the issue's)."""
    config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    ours = GrpoSettings()
    for name in ("num_generations", "temperature", "top_p", "beta", "epsilon", "epsilon_high", "num_iterations"):
        assert getattr(ours, name) == getattr(config, name), name
    assert (ours.loss_type, ours.scale_rewards) == (config.loss_type, config.scale_rewards)
    assert ours.use_bias_correction_kl == config.use_bias_correction_kl
    assert ours.max_completion_length == 256 != config.max_completion_length

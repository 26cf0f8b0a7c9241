"""Preference tuning (`training.method: dpo` and `orpo`, finetune_api.objectives): rows are pairs.

A micro-batch of B pairs is one forward of 2B sequences, the B chosen answers then the B
rejected ones (TRL's order), right-padded. The LM head (loss_head.LossHead) returns each
sequence's cross-entropy summed under the objective's masks, never the logits, so the vocabulary
is held a chunk at a time as in SFT. DPO's reference is the same model with every LoRA layer
switched off, a forward without gradients before the trained one (so the two never hold
activations at once): no second copy of the weights.

Both losses are means over the step's pairs, over every rank and micro-batch (the loop divides
by the step's pair count, `counts()[0]`), so 2 processes with accumulation k train what 1 with
2k does; ORPO's cross-entropy term is a mean over the step's chosen tokens, its second total.
A padding pair (fsdp, past the data's end) has weight 0.

Where one forward of 2B sequences does not fit, the plan splits the pair (`finetune_plan.pairs`):
the B chosen sequences go through, then the B rejected ones (`Preference.split_loss_sum`). A
pair's loss needs both sides' log-probabilities before either side's gradient, so each side runs
once without gradients first; the loss's gradient with respect to each sequence's sum then
weights that side's forward with gradients, whose backward gives the unsplit gradient.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

import torch
import torch.nn.functional as F
from torch import nn

from finetune_api.objectives.dpo import DpoSpec
from finetune_api.objectives.orpo import OrpoSpec
from finetune_api.spec import FineTuneJobSpec

from ..data.batches import Row, collate
from ..data.pairs import tokenize_pairs
from ..data.tokens import IGNORE
from ..model.loss_head import LossHead
from . import TrainingObjective

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# The figures' TensorBoard tags as TRL's DPOTrainer and ORPOTrainer log them (under train/).
TRL_TAGS: Final = {
    "rewardChosen": "rewards/chosen",
    "rewardRejected": "rewards/rejected",
    "rewardAccuracy": "rewards/accuracies",
    "rewardMargin": "rewards/margins",
    "logpChosen": "logps/chosen",
    "logpRejected": "logps/rejected",
    "nllLoss": "nll_loss",
    "logOddsRatio": "log_odds_ratio",
    "logOddsChosen": "log_odds_chosen",
}


@dataclass(frozen=True)
class PairRow:
    chosen: Row
    rejected: Row
    weight: int = 1  # 0: a padding pair, which adds nothing

    @property
    def targets(self) -> int:
        """Pairs: what the preference losses are a mean over."""
        return self.weight

    @property
    def tokens(self) -> int:
        return self.chosen.tokens + self.rejected.tokens


def _row(ids: list[int], labels: list[int], max_length: int) -> Row:
    ids, labels = ids[:max_length], labels[:max_length]  # keep the start, as TRL's keep_start
    return Row(ids, labels, list(range(len(ids))))


def pair_rows(samples: Sequence[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, max_length: int) -> list[PairRow]:
    out: list[PairRow] = []
    for number, pair in enumerate(tokenize_pairs(samples, tokenizer), start=1):
        for side in pair:
            if side.problem is not None:  # the data check refuses these before any row is made
                raise ValueError(f"sample {number}: {side.problem[0]}: {side.problem[1]}")
        chosen = _row(pair.chosen.input_ids, pair.chosen.labels, max_length)
        rejected = _row(pair.rejected.input_ids, pair.rejected.labels, max_length)
        if not chosen.targets or not rejected.targets:
            raise ValueError(f"sample {number}: maxLength {max_length} leaves an answer of the pair no token")
        out.append(PairRow(chosen, rejected))
    return out


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, without cancellation on either side of -ln 2."""
    return torch.where(x < -math.log(2), torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


@contextmanager
def adapters_off(model: nn.Module) -> Iterator[None]:
    """Every LoRA layer passes its base layer's output alone: the reference model. Only PEFT's
    flag is flipped (no requires_grad change), so FSDP's flat parameters are left as they are."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer) and not m._disable_adapters]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


@contextmanager
def unmeasured(head: LossHead) -> Iterator[None]:
    """A forward without gradients that the memory probe does not cut into phases: the loop set
    the probe for the micro-batch's trained forward, whose phases it measures."""
    probe, head.probe = head.probe, None
    try:
        with torch.no_grad():
            yield
    finally:
        head.probe = probe


def sequence_sums(
    model: nn.Module, head: LossHead, batch: dict[str, torch.Tensor], masks: torch.Tensor
) -> torch.Tensor:
    """(K, S): each sequence's next-token cross-entropy on `batch["targets"]`, summed under each
    of the K masks (over the shifted positions)."""
    head.labels = batch["targets"]
    head.row_masks = masks
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    out: torch.Tensor = model(**inputs, use_cache=False).logits
    return out.reshape(masks.shape[0], masks.shape[1])


def side(batch: dict[str, torch.Tensor], start: int, end: int) -> dict[str, torch.Tensor]:
    """Sequences `start:end` of a pair batch (its chosen or its rejected ones), as wide as their
    longest: right padding the other side needed is no part of this side's forward."""
    mask = batch["attention_mask"][start:end]
    width = int(mask.sum(dim=1).max())
    out = {k: v[start:end, :width] for k, v in batch.items() if k != "weight"}
    out["weight"] = batch["weight"]
    return out


def rng_state() -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """The generators dropout draws from: the CPU's, and every GPU's where CUDA is in use."""
    # torch 2.7 leaves torch.cuda.is_initialized unannotated.
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None  # type: ignore[no-untyped-call]
    return torch.get_rng_state(), cuda


def set_rng_state(state: tuple[torch.Tensor, list[torch.Tensor] | None]) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


class Preference(TrainingObjective):
    """What DPO and ORPO share: pair rows, their batches, their progress figures, and the pair
    split's micro-batch. Each objective says which sums of a sequence it reads (`masks`), which it
    holds fixed (`fixed_sums`: DPO's reference) and its loss of them (`loss_of`)."""

    figure_names: tuple[str, ...] = (
        "rewardChosen",
        "rewardRejected",
        "rewardAccuracy",
        "rewardMargin",
        "logpChosen",
        "logpRejected",
    )

    def masks(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(K, S, T - 1): the masks each sequence's cross-entropy is summed under."""
        raise NotImplementedError

    def fixed_sums(
        self, model: nn.Module, head: LossHead, batch: dict[str, torch.Tensor], masks: torch.Tensor
    ) -> torch.Tensor | None:
        """Sums the loss reads without training them (DPO's reference), or None."""
        return None

    def loss_of(
        self, sums: torch.Tensor, fixed: torch.Tensor | None, batch: dict[str, torch.Tensor], totals: Sequence[float]
    ) -> torch.Tensor:
        """The micro-batch's summed loss from its sequences' sums (chosen ones first); records
        the step's figures."""
        raise NotImplementedError

    def loss_sum(
        self, model: nn.Module, head: LossHead, batch: dict[str, torch.Tensor], totals: Sequence[float]
    ) -> torch.Tensor:
        if self.split:
            return self.split_loss_sum(model, head, batch, totals)
        masks = self.masks(batch)
        fixed = self.fixed_sums(model, head, batch, masks)
        return self.loss_of(sequence_sums(model, head, batch, masks), fixed, batch, totals)

    def split_loss_sum(
        self, model: nn.Module, head: LossHead, batch: dict[str, torch.Tensor], totals: Sequence[float]
    ) -> torch.Tensor:
        """The pair split: the chosen sequences and the rejected ones as two forwards of B.

        Each side's sums without gradients first, then the loss of the whole micro-batch on
        copies of them, and its gradient with respect to each sequence's sum (autograd on that
        small function). Each side then runs again with gradients, its dropout masks the same
        (the generators restored), and the backward of (that gradient x the side's sums) gives
        the side's part of the unsplit gradient. The chosen side's backward runs here, scaled as
        the loop scales (1 / the step's pairs); the rejected side's is left to the loop: what
        comes back is that side's weighted sums, plus a constant making its value the pairs'
        summed loss, which the loop adds to the step's."""
        count = len(batch["weight"])
        sides = [side(batch, 0, count), side(batch, count, 2 * count)]
        masks = [self.masks(s) for s in sides]
        fixed = [self.fixed_sums(model, head, s, m) for s, m in zip(sides, masks, strict=True)]
        probe = head.probe
        states, sums = [], []
        with unmeasured(head):
            for part, mask in zip(sides, masks, strict=True):
                states.append(rng_state())
                sums.append(sequence_sums(model, head, part, mask))
        leaves = [s.detach().requires_grad_() for s in sums]
        whole = None if fixed[0] is None or fixed[1] is None else torch.cat([fixed[0], fixed[1]], dim=1)
        # torch 2.7 leaves enable_grad's __init__ unannotated.
        with torch.enable_grad():  # type: ignore[no-untyped-call]
            total = self.loss_of(torch.cat(leaves, dim=1), whole, batch, totals)
            weights = torch.autograd.grad(total, leaves)
        set_rng_state(states[0])
        chosen = (weights[0] * sequence_sums(model, head, sides[0], masks[0])).sum()
        # torch 2.7 leaves Tensor.backward unannotated.
        (chosen * (1.0 / max(totals[0], 1.0))).backward()  # type: ignore[no-untyped-call]
        if probe is not None:  # the chosen side's pass is cut into phases as any other
            probe.backward_done()
            probe.forward_starts()
        set_rng_state(states[1])
        rejected = (weights[1] * sequence_sums(model, head, sides[1], masks[1])).sum()
        return rejected - rejected.detach() + total.detach()

    def rows(
        self, samples: Sequence[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, spec: FineTuneJobSpec
    ) -> list[Any]:
        return list(pair_rows(samples, tokenizer, spec.training.max_length))

    def collate(self, rows: Sequence[Any], pad_id: int, device: torch.device, packed: bool) -> dict[str, torch.Tensor]:
        sequences = [r.chosen for r in rows] + [r.rejected for r in rows]
        batch = collate(sequences, pad_id, device, packed=False)
        # The answers' targets (labels) and every token's (ORPO's cross-entropy): padding is IGNORE.
        batch["targets"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE)
        batch["weight"] = torch.tensor([float(r.weight) for r in rows], device=device)
        return batch

    def padding(self, row: Any) -> Any:
        return PairRow(row.chosen, row.rejected, weight=0)

    def answer_mask(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return (batch["labels"][:, 1:] != IGNORE).float()

    def record(
        self, weight: torch.Tensor, chosen_reward: torch.Tensor, rejected_reward: torch.Tensor, logps: torch.Tensor
    ) -> None:
        """Add the micro-batch's pairs to the step's figures (TRL's names: rewards/chosen, ...)."""
        count = len(weight)
        with torch.no_grad():
            figures = torch.stack(
                [
                    chosen_reward,
                    rejected_reward,
                    (chosen_reward > rejected_reward).float(),
                    chosen_reward - rejected_reward,
                    logps[:count],
                    logps[count:],
                ]
            )
            for index, value in enumerate((figures * weight).sum(dim=1).tolist()):
                self.sums[index] += float(value)

    # Each evaluated pair's summed log-probability of its chosen answer less its rejected one's,
    # the objective's implicit rewards of both, and its weight (0: a padding pair).
    example_names = ("logpMargin", "rewardChosen", "rewardRejected", "weight")

    def keep_examples(
        self, weight: torch.Tensor, sums: torch.Tensor, chosen_reward: torch.Tensor, rejected_reward: torch.Tensor
    ) -> None:
        """Each pair's figures into `examples` while the evaluation keeps them; `sums` the
        sequences' summed answer cross-entropy (chosen ones first)."""
        if self.examples is None:
            return
        count = len(weight)
        with torch.no_grad():
            margin = sums[count:] - sums[:count]  # log p(chosen) - log p(rejected), summed over answer tokens
            rows = torch.stack([margin, chosen_reward, rejected_reward, weight]).T.tolist()
        self.examples.extend(tuple(float(v) for v in row) for row in rows)

    def step_metrics(self, loss: float, trained: int, sums: Sequence[float] = ()) -> dict[str, float]:
        pairs = max(trained, 1)
        return {name: value / pairs for name, value in zip(self.figure_names, sums, strict=False)}

    trained_name = "pairs"
    metric_tags = MappingProxyType(TRL_TAGS)

    def metrics_text(self, metrics: Mapping[str, float]) -> str | None:
        if "rewardAccuracy" not in metrics or "rewardMargin" not in metrics:
            return None
        return f"reward acc {metrics['rewardAccuracy']:.2f} margin {metrics['rewardMargin']:.3g}"


class Dpo(Preference):
    def masks(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.answer_mask(batch).unsqueeze(0)

    def fixed_sums(
        self, model: nn.Module, head: LossHead, batch: dict[str, torch.Tensor], masks: torch.Tensor
    ) -> torch.Tensor | None:
        """The reference's sums: the model with its adapter off, without gradients."""
        with unmeasured(head), adapters_off(model):
            return sequence_sums(model, head, batch, masks)

    def loss_of(
        self, sums: torch.Tensor, fixed: torch.Tensor | None, batch: dict[str, torch.Tensor], totals: Sequence[float]
    ) -> torch.Tensor:
        assert fixed is not None
        settings = self.settings
        weight = batch["weight"]
        count = len(weight)
        reference = -fixed[0]
        policy = -sums[0]
        ratios = policy - reference
        chosen, rejected = ratios[:count], ratios[count:]
        if settings.loss_type == "ipo":
            # TRL's IPO: the log-ratios per answer token, so beta reads alike for any length.
            lengths = self.answer_mask(batch).sum(dim=1).clamp(min=1.0)
            delta = chosen / lengths[:count] - rejected / lengths[count:]
            losses = (delta - 1 / (2 * settings.beta)) ** 2
        else:
            losses = -F.logsigmoid(settings.beta * (chosen - rejected))
        self.record(weight, settings.beta * chosen.detach(), settings.beta * rejected.detach(), policy.detach())
        self.keep_examples(weight, sums[0], settings.beta * chosen.detach(), settings.beta * rejected.detach())
        return (losses * weight).sum()

    def configure(self, spec: FineTuneJobSpec) -> None:
        self.settings = spec.training.settings_of(DpoSpec)


class Orpo(Preference):
    figure_names = (*Preference.figure_names, "nllLoss", "logOddsRatio", "logOddsChosen")

    def counts(self, rows: Sequence[Any]) -> list[float]:
        """Pairs, then the chosen sequences' tokens that are targets of the cross-entropy term."""
        pairs = float(sum(r.targets for r in rows))
        # Every token of a chosen sequence but its first (no position predicts that one).
        tokens = float(sum(len(r.chosen.input_ids) - 1 for r in rows if r.weight))
        return [pairs, tokens]

    def configure(self, spec: FineTuneJobSpec) -> None:
        self.settings = spec.training.settings_of(OrpoSpec)

    def masks(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        answers = self.answer_mask(batch)
        every = (batch["targets"][:, 1:] != IGNORE).float()
        return torch.stack([answers, every])

    def loss_of(
        self, sums: torch.Tensor, fixed: torch.Tensor | None, batch: dict[str, torch.Tensor], totals: Sequence[float]
    ) -> torch.Tensor:
        beta = self.settings.beta
        weight = batch["weight"]
        count = len(weight)
        answers = self.answer_mask(batch)
        # Mean log-probability per answer token (TRL's average_log_prob).
        logps = -sums[0] / answers.sum(dim=1).clamp(min=1.0)
        chosen, rejected = logps[:count], logps[count:]
        log_odds = (chosen - rejected) - (log1mexp(chosen) - log1mexp(rejected))
        ratio = F.logsigmoid(log_odds)
        # The cross-entropy of every token of the chosen sequences, a mean over the step's such
        # tokens; the loop divides the whole by the step's pairs, so it is scaled by pairs / tokens.
        nll = (sums[1][:count] * weight).sum()
        pairs, tokens = totals[0], max(totals[1], 1.0)
        self.record(weight, beta * chosen.detach(), beta * rejected.detach(), logps.detach())
        self.keep_examples(weight, sums[0], beta * chosen.detach(), beta * rejected.detach())
        with torch.no_grad():
            for index, value in enumerate(
                (float(nll) * pairs / tokens, float((ratio * weight).sum()), float((log_odds * weight).sum())),
                start=len(Preference.figure_names),
            ):
                self.sums[index] += value
        return nll * (pairs / tokens) - beta * (ratio * weight).sum()

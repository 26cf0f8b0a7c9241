"""GRPO as a training objective (`training.method: grpo`, `training.grpo`).

An optimizer step starts with its rollouts (`prepare_step`, before any gradient): the policy
writes G completions of each of the rank's prompts (rollouts.py, sampled from noise keyed by
the step and the prompt's place in it, so any split over ranks samples alike), the rewards score
them, and each completion's advantage follows from its group (the batch's spread is summed over
the ranks). With `numIterations` > 1 the log-probabilities of the policy that sampled are taken
then, and the batch serves that many optimizer steps (the schedule repeats its rows). Each
micro-batch is then one forward of its prompts' completions with gradients, the per-token
log-probabilities taken in the LM head (loss_head.LossHead, in chunks), and TRL's loss of them
(loss.py); with `beta` set, the reference is the model with its adapter off, a forward without
gradients first, as DPO's.

The step's loss is the micro-batches' summed loss over the step's total (`counts`: completions,
or their tokens for dapo/bnpo, or completions x maxCompletionLength for dr_grpo), the project's
rule for every objective, so 2 processes train what 1 with twice the accumulation does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from finetune_api.objectives.grpo import GrpoSpec
from finetune_api.spec import FineTuneJobSpec

from ...data.prompts import prompt_ids
from ...data.tokens import IGNORE
from ...distributed.gradsync import sum_figures
from ...distributed.topology import Topology
from ...model.dropout import dropout_off
from ...model.loss_head import LossHead
from .. import TrainingObjective
from ..preference import adapters_off, unmeasured
from .batch import COMPLETIONS_FILE, MicroRollouts, PromptRow, completion_figures, tensors, with_advantages, write_group
from .figures import FIXED_SUMS, step_figures, text
from .loss import figure_sums, loss_sum, token_terms
from .rewards import Completions, Reward, RewardFailed, parse_rewards, score, sum_names
from .rollouts import PolicyRollouts, Sampling
from .sampling import row_keys
from .settings import GrpoSettings

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class RolloutHost(Protocol):
    """What a step's rollouts need of the loop."""

    model: nn.Module
    head: LossHead
    device: torch.device
    topology: Topology
    pad_id: int
    seed: int

    @property
    def lockstep(self) -> bool: ...


class Grpo(TrainingObjective):
    def configure(self, spec: FineTuneJobSpec) -> None:
        from finetune_api.method_settings import settings_of

        block = settings_of(spec.training, GrpoSpec)
        self.settings = GrpoSettings(**block.as_settings())
        self.rewards: tuple[Reward, ...] = tuple(parse_rewards(block.reward_settings()))
        self.names = tuple(reward.name for reward in self.rewards)
        self.figure_names = (*sum_names(self.names), *FIXED_SUMS)
        self.sums = [0.0] * len(self.figure_names)
        self.trained_name = "completions"
        # Optimizer steps each batch of rollouts serves (TRL's numIterations).
        self.repeats = self.settings.num_iterations
        self.records: list[dict[str, Any]] = []
        self.max_prompt = spec.training.max_length - self.settings.max_completion_length
        self.generation: int | None = None  # the optimizer step whose rows the rollouts hold
        self.micros: dict[int, MicroRollouts] = {}  # by the micro-batch's place in the step
        self.per_step = 1
        self.shown: list[dict[str, Any]] = []  # the step's first group, for completions.jsonl

    def rows(
        self, samples: Sequence[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, spec: FineTuneJobSpec
    ) -> list[Any]:
        self.tokenizer = tokenizer
        self.records = [dict(sample) for sample in samples]
        out = []
        for number, sample in enumerate(self.records, start=1):
            ids = prompt_ids(sample, tokenizer)
            if len(ids) > self.max_prompt:
                raise ValueError(
                    f"sample {number}: prompt of {len(ids)} tokens, more than training.maxLength less "
                    f"training.grpo.maxCompletionLength ({self.max_prompt})"
                )
            out.append(PromptRow(ids, number - 1))
        if out:
            self.first_row = out[0]
        return out

    def padding(self, row: Any) -> Any:
        return PromptRow(row.input_ids, row.index, weight=0)

    def collate(self, rows: Sequence[Any], pad_id: int, device: torch.device, packed: bool) -> dict[str, torch.Tensor]:
        raise RuntimeError("GRPO's micro-batches come from the step's rollouts (micro_batch)")

    # --- the step's rollouts -------------------------------------------------------------

    def prepare_step(self, step: int, micro: Sequence[tuple[int, Sequence[Any]]], host: RolloutHost) -> None:
        """The rollouts, rewards and advantages of every micro-batch of optimizer step `step` on
        this rank (collective under fsdp and for the batch's spread); kept for the steps the
        batch serves."""
        generation = step - step % self.repeats
        if self.generation == generation and self.micros:
            return
        settings, world = self.settings, host.topology.world_size
        per_step = len(micro) * world
        engine = PolicyRollouts(
            host.model,
            host.head,
            host.device,
            Sampling(settings.max_completion_length, settings.temperature, settings.top_p, self._end_ids()),
            lockstep=host.lockstep,
            world_size=world,
            filler=self.first_row.input_ids,
        )
        made: list[MicroRollouts] = []
        for number, chosen in micro:
            rows = list(chosen) or ([self.padding(self.first_row)] if host.lockstep else [])
            place = number % per_step
            made.append(self._rollouts(engine, host.seed, generation, place, rows))
        made = self._scored(made, host)
        spread = self._batch_std(made, host) if settings.scale_rewards == "batch" else None
        made = with_advantages(made, settings.num_generations, settings.scale_rewards, spread)
        if settings.num_iterations > 1:
            made = [self._with_old_logps(m, host) for m in made]
        self.generation = generation
        self.per_step = per_step
        self.micros = {number % per_step: made_one for (number, _), made_one in zip(micro, made, strict=True)}

    def _end_ids(self) -> frozenset[int]:
        eos = self.tokenizer.eos_token_id
        found = eos if isinstance(eos, list) else [eos]
        return frozenset(int(i) for i in found if i is not None)

    def _rollouts(
        self, engine: PolicyRollouts, seed: int, generation: int, place: int, rows: list[PromptRow]
    ) -> MicroRollouts:
        real = [row for row in rows if row.weight]
        generations = self.settings.num_generations
        keys = row_keys(seed, generation, [place * 4096 + i for i in range(len(real))], generations)
        groups = [keys[start : start + generations] for start in range(0, keys.shape[0], generations)]
        written = engine.generate([row.input_ids for row in real], groups)
        completions = tuple(tuple(c) for group in written for c in group)
        ends = self._end_ids()
        truncated = tuple(not c or c[-1] not in ends for c in completions)
        return MicroRollouts(tuple(rows), completions, truncated=truncated)

    def _scored(self, micros: list[MicroRollouts], host: RolloutHost) -> list[MicroRollouts]:
        """Every micro-batch's rewards; a reward that fails on any rank fails the step on every
        rank, naming it (the others' line says where the cause is)."""
        failure: RewardFailed | None = None
        out: list[MicroRollouts] = []
        for micro in micros:
            if failure is not None or not micro.real_rows:
                out.append(micro)
                continue
            texts = tuple(self._decode(c) for c in micro.completions)
            try:
                scores = score(self.rewards, self._completions(micro, texts), self.settings.num_generations)
            except RewardFailed as exc:
                failure = exc
                out.append(micro)
                continue
            out.append(replace(micro, texts=texts, scores=scores))
        failed = [1.0 if failure is not None and failure.reward == name else 0.0 for name in self.names]
        seen = sum_figures(failed, host.topology.world_size, host.device)
        if failure is not None:
            raise failure
        for name, count in zip(self.names, seen, strict=True):
            if count > 0:
                raise RewardFailed(name, "failed on another rank (its log holds the cause)")
        return out

    def _completions(self, micro: MicroRollouts, texts: tuple[str, ...]) -> Completions:
        generations = self.settings.num_generations
        records = [self.records[row.index] for row in micro.real_rows for _ in range(generations)]
        return Completions(
            prompts=[record.get("prompt", "") for record in records],
            completions=list(texts),
            records=records,
            count_tokens=self._count_tokens,
        )

    def _count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _decode(self, ids: Sequence[int]) -> str:
        text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        assert isinstance(text, str)
        return text

    def _batch_std(self, micros: list[MicroRollouts], host: RolloutHost) -> float:
        """The standard deviation (Bessel's) of every total reward of the step, over the ranks."""
        totals = [t for m in micros if m.scores is not None for t in m.scores.totals]
        count, total, squares = sum_figures(
            [float(len(totals)), math.fsum(totals), math.fsum(t * t for t in totals)],
            host.topology.world_size,
            host.device,
        )
        if count < 2:
            return math.nan
        return math.sqrt(max(0.0, (squares - total * total / count) / (count - 1)))

    def _with_old_logps(self, micro: MicroRollouts, host: RolloutHost) -> MicroRollouts:
        """The sampling policy's log-probabilities, for the ratio of the later iterations."""
        batch = tensors(micro, self.settings.num_generations, host.pad_id, host.device)
        # Dropout off: the sampling policy's own figures, the same whichever rank takes them
        # (no generator's state read), as the rollouts were written.
        with unmeasured(host.head), dropout_off(host.model):
            logps = self._logps(host.model, host.head, batch)
        return replace(micro, extra={"old_logps": logps.detach().cpu()})

    # --- the loop's side ------------------------------------------------------------------

    def micro_batch(
        self, number: int, rows: Sequence[Any], pad_id: int, device: torch.device, packed: bool
    ) -> dict[str, torch.Tensor]:
        place = number % self.per_step
        batch = tensors(self.micros[place], self.settings.num_generations, pad_id, device)
        batch["place"] = torch.tensor([place])
        return batch

    def counts(self, rows: Sequence[Any]) -> list[float]:
        """The step's loss total on this rank (`loss.loss_count`'s, from the completions'
        lengths) and its completions (what progress counts)."""
        settings = self.settings
        total = completions = 0.0
        for micro in self.micros.values():
            lengths = [len(c) for c in micro.completions]
            completions += len(lengths)
            if settings.loss_type == "grpo":
                total += len(lengths)
            elif settings.loss_type == "dr_grpo":
                total += len(lengths) * settings.max_completion_length
            else:
                total += sum(lengths)
        return [total, completions]

    def tokens_of(self, rows: Sequence[Any], batch: dict[str, torch.Tensor]) -> int:
        """The scored sequences' tokens: each real prompt G times, and its completions."""
        micro = self.micros[int(batch["place"][0])]
        prompts = sum(len(row.input_ids) for row in micro.real_rows) * self.settings.num_generations
        return prompts + sum(len(c) for c in micro.completions) if rows else 0

    def trained(self, totals: Sequence[float]) -> float:
        return totals[1]

    def _logps(self, model: nn.Module, head: LossHead, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        head.labels = batch["labels"]
        head.token_logps = True
        head.temperature = self.settings.temperature
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
        out: torch.Tensor = model(**inputs, use_cache=False).logits
        return out.reshape(batch["labels"].shape[0], -1)

    def loss_sum(
        self, model: nn.Module, head: LossHead, batch: dict[str, torch.Tensor], totals: Sequence[float]
    ) -> torch.Tensor:
        settings = self.settings
        mask = (batch["labels"][:, 1:] != IGNORE).float()
        reference = None
        if settings.beta != 0.0:  # before the trained forward: the two never hold activations at once
            with adapters_off(model), unmeasured(head):
                reference = self._logps(model, head, batch).detach()
        logps = self._logps(model, head, batch)
        advantages = batch["advantages"]
        terms = token_terms(logps, batch.get("old_logps"), reference, advantages, settings)
        micro = self.micros[int(batch["place"][0])]
        self._add([*figure_sums(terms, advantages, mask, settings)[:4], float(mask.sum())], micro)
        return loss_sum(terms, mask, settings)

    def _add(self, loss_figures: list[float], micro: MicroRollouts) -> None:
        rewards = list(micro.scores.sums()) if micro.scores is not None else [0.0] * len(sum_names(self.names))
        found = rewards + loss_figures + completion_figures(micro)
        self.sums = [a + b for a, b in zip(self.sums, found, strict=True)]

    def step_metrics(self, loss: float, trained: int, sums: Sequence[float] = ()) -> dict[str, float]:
        return step_figures(self.names, sums or self.sums, self.settings.beta != 0.0)

    def metrics_text(self, metrics: Mapping[str, float]) -> str | None:
        return text(metrics)

    def write_samples(self, step: int, folder: Path) -> None:
        """The step's first group on this rank, each completion with its rewards and advantage,
        appended to completions.jsonl (one line per step)."""
        micro = next((m for m in self.micros.values() if m.scores is not None), None)
        if micro is None:
            return
        write_group(folder / COMPLETIONS_FILE, step, self.records[micro.real_rows[0].index], micro, self.names)

"""What a plan says of its GRPO step (`GrpoStep`: the rollouts' shape, their KV cache, the
step's seconds by part), and the job's optimizer steps (`optimizer_steps`): the schedule's steps
over the prompts, times numIterations (each batch of rollouts serves that many)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from finetune_api.spec import FineTuneJobSpec

from ..memory import Recipe
from ..model_shape import ModelShape
from ..speed import Mode, Speed
from .phases import kv_cache_bytes, row_lengths
from .spec import terms_of


@dataclass(frozen=True)
class GrpoStep:
    """One process's GRPO step as planned: the rollouts' shape and cache, and its seconds."""

    generations: int  # G: completions per prompt
    prompt_tokens: int  # P: the longest prompt planned (maxLength - maxCompletionLength)
    completion_tokens: int  # C: maxCompletionLength
    prompts: int  # per micro-batch (training.batchSize)
    cached: bool  # with a KV cache (every mode but fsdp)
    kv_cache_bytes: float  # one prompt's G rows at P + C tokens, every layer (0 without a cache)
    accumulation: int  # micro-batches per optimizer step
    iterations: int  # optimizer steps one batch of rollouts serves (numIterations)
    rollout_seconds: float  # one micro-batch's rollouts, whole
    old_logp_seconds: float  # one micro-batch's forward for the old log-probabilities, whole
    reference_seconds: float  # one micro-batch's reference forward (beta > 0)
    micro_batch_seconds: float  # the plan's micro-batch, the rollouts' share in it

    @property
    def generation_seconds(self) -> float:
        """An optimizer step's share of its micro-batches' rollouts."""
        return self.accumulation * self.rollout_seconds / self.iterations

    @property
    def step_seconds(self) -> float:
        """One optimizer step (`duration.optimizer_step_seconds`)."""
        return self.accumulation * self.micro_batch_seconds

    @property
    def scoring_seconds(self) -> float:
        """The rest of the step: the forwards without gradients, the trained passes, the optimizer."""
        return self.step_seconds - self.generation_seconds

    def to_dict(self) -> dict[str, Any]:
        return {
            "numGenerations": self.generations,
            "promptTokens": self.prompt_tokens,
            "completionTokens": self.completion_tokens,
            "promptsPerMicroBatch": self.prompts,
            "kvCache": self.cached,
            "kvCacheBytes": round(self.kv_cache_bytes),
            "numIterations": self.iterations,
            "rolloutSeconds": round(self.rollout_seconds, 3),
            "oldLogpSeconds": round(self.old_logp_seconds, 3),
            "referenceSeconds": round(self.reference_seconds, 3),
            "generationSecondsPerStep": round(self.generation_seconds, 3),
            "scoringSecondsPerStep": round(self.scoring_seconds, 3),
            "stepSeconds": round(self.step_seconds, 3),
        }


def step_of(shape: ModelShape, recipe: Recipe, speed: Speed | None, mode: Mode) -> GrpoStep | None:
    """The GRPO step of a plan's parts; None for another method or without a speed."""
    if recipe.grpo is None or speed is None:
        return None
    prompt, completion = row_lengths(recipe)
    cached = mode != "fsdp"
    return GrpoStep(
        generations=recipe.grpo.num_generations,
        prompt_tokens=prompt,
        completion_tokens=completion,
        prompts=recipe.rows,
        cached=cached,
        kv_cache_bytes=kv_cache_bytes(shape, recipe) if cached else 0.0,
        accumulation=recipe.gradient_accumulation,
        iterations=recipe.grpo.num_iterations,
        rollout_seconds=speed.rollout_seconds,
        old_logp_seconds=speed.old_logp_seconds,
        reference_seconds=speed.reference_seconds,
        micro_batch_seconds=speed.step_seconds,
    )


def optimizer_steps(spec: FineTuneJobSpec, records: int | None, processes: int) -> int | None:
    """The job's optimizer steps: maxSteps, else the schedule's over `records` prompts (its
    epochs of micro-batches of batchSize over every process of every pod, as the trainer's
    `data.batches.Schedule` counts them) times numIterations; None where `records` is unknown."""
    training = spec.training
    if training.max_steps is not None:
        return training.max_steps
    if records is None:
        return None
    world = processes * spec.resources.nodes
    per_epoch = max(1, math.ceil(math.ceil(records / training.batch_size) / (training.gradient_accumulation * world)))
    scheduled = max(1, math.ceil((training.epochs or 1.0) * per_epoch))
    terms = terms_of(training)
    return scheduled * (1 if terms is None else terms.num_iterations)

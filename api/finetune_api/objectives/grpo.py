"""Group relative policy optimisation with verifiable rewards (`training.method: grpo`, `training.grpo`).

Each prompt of the data (`dataset.format: prompt`) gets `numGenerations` completions sampled
from the policy itself; each completion is scored by the rewards the block lists (their weighted
sum), and its advantage is its reward less its group's mean (divided by the group's spread, as
`scaleRewards` says). The loss is the clipped policy-gradient objective of TRL's GRPOTrainer,
aggregated as `lossType` names it, with a KL term to the model without its adapter when `beta` is
above 0. Names and defaults are TRL 1.16's `GRPOConfig`'s where the two overlap.

A job of this method takes no held-out split: its rewards are what it is measured by. An `http`
reward calls a Service of the job's namespace (finetune_api.services); the operator lets the
job's pods reach that Service's pods, and no others.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Final, Literal, Self, TypeVar

from pydantic import ConfigDict, Field, field_validator, model_validator

from finetune_api.base import ApiModel
from finetune_api.objectives import Objective, Rule, register
from finetune_api.services import URL_PATTERN, URL_RULE, ServiceUrl, check_url, read_url

GrpoLossType = Literal["grpo", "dr_grpo", "dapo", "bnpo"]
GrpoScaleRewards = Literal["group", "batch", "none"]
PROMPT: Final = "prompt"
KINDS: Final = ("answer", "format", "length", "http")
NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
MAX_REWARDS: Final = 16
REWARDS_FIELD: Final = "spec.training.grpo.rewards"
REWARD_SERVICE: Final = "a reward service"

ONE_KIND: Final = "a reward is exactly one of answer, format, length or http"
AT_LEAST_ONE: Final = "training.grpo.rewards: at least one reward for training.method grpo"
UNIQUE_NAMES: Final = "training.grpo.rewards: each reward's name is its own (its figures are reported by it)"
ROOM_FOR_THE_PROMPT: Final = (
    "training.grpo.maxCompletionLength must be below training.maxLength: a sequence is the prompt and its completion"
)
MEASURED_BY_REWARDS: Final = "its rewards are what it is measured by"

Pattern = Annotated[str, Field(min_length=1, max_length=1024)]
PatternText = TypeVar("PatternText", str, str | None)
# TrainingSpec.max_length's default (finetune_api.spec imports this package, not the reverse).
DEFAULT_MAX_LENGTH: Final = 2048


def compiles(value: PatternText) -> PatternText:
    """The pattern, or ValueError naming what Python's `re` (the trainer's) says of it."""
    if value is not None:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
    return value


class GrpoAnswerReward(ApiModel):
    field: Annotated[str, Field(min_length=1, max_length=256)] = Field(
        description="The record's field holding the right answer (a string, or an integer)."
    )
    pattern: Pattern | None = Field(
        default=None,
        description="Where the completion says its answer: the first match (Python's re.search), its first group "
        "where it has groups; unset: the whole completion. 1 where that equals the record's field, both trimmed, "
        "else 0.",
    )

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        return compiles(value)


class GrpoFormatReward(ApiModel):
    pattern: Pattern = Field(
        description="1 where this matches anywhere in the completion (Python's re.search, `.` crossing lines), else 0."
    )

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        return compiles(value)


class GrpoLengthReward(ApiModel):
    target: Annotated[int, Field(ge=1, le=32768)] = Field(
        description="The completion's length in tokens that scores 0; the score falls linearly to -1 at a distance "
        "of target tokens either way (-1 beyond)."
    )


class GrpoHttpReward(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                # A JSON string is a CEL string: the pattern's backslashes survive.
                {
                    "rule": f"self.url.matches({json.dumps(URL_PATTERN)})",
                    "message": f"expected {URL_RULE}",
                    "fieldPath": ".url",
                }
            ]
        }
    )

    url: Annotated[str, Field(min_length=1, max_length=2048)] = Field(
        description="A Service of the job's namespace, called with POST and a JSON batch of prompts, completions and "
        "records; it answers one number per completion. Host: svc, svc.ns, svc.ns.svc or svc.ns.svc.cluster.local "
        "(ns the job's namespace); the job's pods may reach that Service's pods on its port, and the job waits "
        "until the Service exists."
    )
    timeout_seconds: Annotated[float, Field(gt=0, le=600)] = Field(
        default=30.0, description="How long one call may take; a call past it fails the step, naming the reward."
    )
    batch_size: Annotated[int, Field(ge=1, le=4096)] = Field(default=64, description="Completions per call.")

    @field_validator("url")
    @classmethod
    def _a_service(cls, value: str) -> str:
        return check_url(value)


def _one_kind_rule() -> str:
    return " + ".join(f"(has(self.{kind}) ? 1 : 0)" for kind in KINDS) + " == 1"


class GrpoReward(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [{"rule": _one_kind_rule(), "message": ONE_KIND}]}
    )

    name: Annotated[str, Field(min_length=1, max_length=63, pattern=NAME_PATTERN)] = Field(
        description="What its figures are called (rewards/<name>/mean) and its failures name: letters, digits, "
        "'.', '_' and '-', at most 63."
    )
    weight: Annotated[float, Field(ge=-1000, le=1000)] = Field(
        default=1.0, description="Its factor in the completion's reward, the weighted sum of every reward."
    )
    answer: GrpoAnswerReward | None = Field(default=None, description="The completion's answer against the record's.")
    format: GrpoFormatReward | None = Field(default=None, description="Whether the completion has the shape asked.")
    length: GrpoLengthReward | None = Field(
        default=None, description="A penalty growing with the distance from a length."
    )
    http: GrpoHttpReward | None = Field(default=None, description="A score from a service of the job's namespace.")

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        if sum(getattr(self, kind) is not None for kind in KINDS) != 1:
            raise ValueError(ONE_KIND)
        return self


class GrpoSpec(ApiModel):
    model_config = ConfigDict(title="GRPO's settings")

    num_generations: Annotated[int, Field(ge=2, le=64)] = Field(
        default=8, description="Completions sampled per prompt: the group each completion's reward is compared within."
    )
    max_completion_length: Annotated[int, Field(ge=1, le=32768)] = Field(
        default=256,
        description="Tokens a completion may have (up to and with its EOS); below training.maxLength, which bounds "
        "the prompt and its completion together.",
    )
    temperature: Annotated[float, Field(gt=0, le=10)] = Field(default=1.0, description="Sampling temperature.")
    top_p: Annotated[float, Field(gt=0, le=1)] = Field(
        default=1.0, description="Nucleus sampling: the smallest set of tokens whose probability reaches this."
    )
    beta: Annotated[float, Field(ge=0, le=100)] = Field(
        default=0.0,
        description="Weight of the KL term to the reference, the model with its adapter off (as DPO's); 0: none, and "
        "no reference forward.",
    )
    epsilon: Annotated[float, Field(ge=0, le=10)] = Field(
        default=0.2, description="Clipping: the probability ratio is held to [1 - epsilon, 1 + epsilonHigh]."
    )
    epsilon_high: Annotated[float, Field(ge=0, le=10)] | None = Field(
        default=None, description="The ratio's upper clip (DAPO's clip-higher); unset: epsilon."
    )
    num_iterations: Annotated[int, Field(ge=1, le=16)] = Field(
        default=1,
        description="Optimizer steps each batch of completions serves (TRL's mu): the steps of the job are this many "
        "times the schedule's.",
    )
    loss_type: GrpoLossType = Field(
        default="dapo",
        description="How the tokens' losses are summed, as TRL names it: grpo = each completion's mean, then the "
        "mean; dr_grpo = divided by completions x maxCompletionLength; dapo = every token of the step's "
        "completions alike; bnpo = every token of the micro-batch alike.",
    )
    scale_rewards: GrpoScaleRewards = Field(
        default="group",
        description="The advantage is the reward less its group's mean, divided by: group = the group's std, "
        "batch = the batch's std, none = nothing (Dr. GRPO).",
    )
    use_bias_correction_kl: bool = Field(
        default=True,
        description="The KL term times the ratio to the sampling policy (TRL's default): it differs from the plain "
        "one only once the policy has moved.",
    )
    rewards: Annotated[list[GrpoReward], Field(max_length=MAX_REWARDS)] = Field(
        default_factory=list,
        description="What a completion is rewarded for (at least one): its reward is their weighted sum, and each "
        "one's mean is reported by its name.",
    )

    def as_settings(self) -> dict[str, Any]:
        """The trainer's GrpoSettings keyword arguments (snake_case): every field but the rewards."""
        return self.model_dump(by_alias=False, exclude={"rewards"})

    def reward_settings(self) -> list[dict[str, Any]]:
        """The rewards as the trainer's parse_rewards reads them: the spec's YAML shape (camelCase)."""
        return [reward.model_dump(by_alias=True, exclude_none=True) for reward in self.rewards]

    def services(self) -> tuple[ServiceUrl, ...]:
        """The Services its http rewards call, each with the field that names it."""
        return tuple(
            read_url(f"{REWARDS_FIELD}[{index}].http.url", REWARD_SERVICE, reward.http.url)
            for index, reward in enumerate(self.rewards)
            if reward.http is not None
        )


def _settings(training: Any) -> GrpoSpec:
    block: GrpoSpec = training.settings_of(GrpoSpec)
    return block


def _has_rewards(training: Any) -> bool:
    return bool(_settings(training).rewards)


def _unique_names(training: Any) -> bool:
    names = [reward.name for reward in _settings(training).rewards]
    return len(names) == len(set(names))


def _room_for_the_prompt(training: Any) -> bool:
    return _settings(training).max_completion_length < int(training.max_length)


def _services(training: Any) -> tuple[ServiceUrl, ...]:
    return _settings(training).services()


_REWARDS: Final = "has(self.grpo) && has(self.grpo.rewards)"
_COMPLETION: Final = (
    f"(has(self.grpo) && has(self.grpo.maxCompletionLength) ? self.grpo.maxCompletionLength : "
    f"{GrpoSpec().max_completion_length})"
)

GRPO: Final = register(
    Objective(
        name="grpo",
        description="group relative policy optimisation: completions sampled from the model, scored by verifiable "
        "rewards (training.grpo)",
        dataset_formats={PROMPT: "prompt: a string or messages; any other fields are the record the rewards read"},
        trainer="finetune_trainer.objectives.grpo.objective:Grpo",
        sequences_per_row=1,
        packs=False,
        unpacked="each of its sequences is a prompt and one completion sampled for it",
        # The method too: another one's checkpoint is named as such, not only by its settings block.
        tracked=("spec.training.method", "spec.dataset.format", "spec.training.grpo"),
        settings=GrpoSpec,
        order=40,
        rules=(
            Rule(f"{_REWARDS} && size(self.grpo.rewards) > 0", _has_rewards, AT_LEAST_ONE, ".grpo.rewards"),
            Rule(
                f"!({_REWARDS}) || self.grpo.rewards.all(r, self.grpo.rewards.exists_one(s, s.name == r.name))",
                _unique_names,
                UNIQUE_NAMES,
                ".grpo.rewards",
            ),
            Rule(
                f"{_COMPLETION} < (has(self.maxLength) ? self.maxLength : {DEFAULT_MAX_LENGTH})",
                _room_for_the_prompt,
                ROOM_FOR_THE_PROMPT,
                ".grpo.maxCompletionLength",
            ),
        ),
        no_held_out=MEASURED_BY_REWARDS,
        services=_services,
    )
)

"""What every reward reads and returns, and how a reward fails.

A reward scores one batch of completions at a time (`Completions`: G consecutive completions per
prompt, each with its prompt and its dataset record), one number per completion. A reward that
cannot score raises `RewardError` with what went wrong; `scoring.score` turns that, or any other
exception a reward raises, into `RewardFailed`, the one failure the objective sees, whose message
is one line naming the reward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from finetune_api.reasons import ExitReason

from ....failures import TrainerFailure

# A prompt as the dataset holds it (`dataset.format: prompt`): text, or chat messages.
Prompt = str | Sequence[Mapping[str, Any]]
# One dataset record: the prompt and any other fields the rewards read (an `answer`'s field).
Record = Mapping[str, Any]

# The longest message a failure carries: a status line and a termination message, not a log.
MESSAGE_LIMIT = 500


def one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """`text` with its line breaks and runs of spaces as single spaces, cut at `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


@dataclass(frozen=True)
class Completions:
    """One batch to score: entry i of each sequence belongs to completion i.

    `count_tokens` is the trainer's tokenizer (the text's token count without special tokens),
    what `length` measures in.
    """

    prompts: Sequence[Prompt]
    completions: Sequence[str]
    records: Sequence[Record]
    count_tokens: Callable[[str], int]

    def __post_init__(self) -> None:
        if not len(self.prompts) == len(self.completions) == len(self.records):
            raise ValueError(
                f"{len(self.prompts)} prompts, {len(self.completions)} completions and "
                f"{len(self.records)} records: one of each per completion"
            )

    def __len__(self) -> int:
        return len(self.completions)


class Reward(Protocol):
    """A named, weighted reward: one number per completion of the batch it is given."""

    @property
    def name(self) -> str: ...

    @property
    def weight(self) -> float: ...

    def score(self, batch: Completions) -> Sequence[object]:
        """One value per completion; `scoring.score` checks that each is a finite number."""
        ...


class RewardError(Exception):
    """What a reward says when it cannot score: its message is shown as it is, after the name."""


class RewardFailed(TrainerFailure):
    """A reward could not score the step's completions: `reward 'judge' failed: <cause>`.

    Retryable (TrainerError): the step has changed nothing yet, so the next attempt resumes from
    the last checkpoint and runs it again.
    """

    def __init__(self, reward: str, cause: str) -> None:
        super().__init__(ExitReason.TrainerError, one_line(f"reward '{reward}' failed: {cause}"))
        self.reward = reward


class RewardSettingsInvalid(TrainerFailure):
    """A reward's settings cannot be used: `<field>: <problem>`, the field by its path in the spec."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(ExitReason.InvalidConfig, one_line(f"{field}: {problem}"))
        self.field = field

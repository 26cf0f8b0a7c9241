"""GRPO's rewards (`training.grpo.rewards`): verifiable rewards of a completion and their sum.

A step's completions are scored by every reward the spec lists, each named and weighted; the
completion's reward is their weighted sum, from which the loss's group-relative advantages are
computed (`..loss`). The kinds (`text.py`: `answer`, `format`, `length`; `remote.py`: `http`)
read a batch of completions with their prompts and dataset records (`base.Completions`); the
settings become rewards in `parsing.py`; `scoring.py` runs them, checks what each returns, and
keeps the sums the step's figures are made of (each reward's mean by name, the spread within
groups).

A reward that fails (it raises, returns another count or a value that is not a finite number,
its service answers an HTTP error or not in time) fails the step as `RewardFailed`, one line
naming the reward: `reward 'judge' failed: ...`. Nothing here imports torch: the rewards are
text and numbers, and the CLI's checks may parse the settings without the trainer's stack.
"""

from .base import Completions, Prompt, Record, Reward, RewardError, RewardFailed, RewardSettingsInvalid
from .parsing import parse_rewards
from .remote import HttpReward
from .scoring import Scores, figures, score, sum_names
from .text import AnswerReward, FormatReward, LengthReward

__all__ = [
    "AnswerReward",
    "Completions",
    "FormatReward",
    "HttpReward",
    "LengthReward",
    "Prompt",
    "Record",
    "Reward",
    "RewardError",
    "RewardFailed",
    "RewardSettingsInvalid",
    "Scores",
    "figures",
    "parse_rewards",
    "score",
    "sum_names",
]

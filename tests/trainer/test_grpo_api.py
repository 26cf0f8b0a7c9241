"""The API's GRPO block is what the trainer reads: its settings give the trainer's GrpoSettings,
field for field and default for default (TRL's names), and its rewards are parse_rewards' input
as they are. The block itself is in tests/api/test_grpo_block.py."""

import dataclasses

from finetune_api.objectives.grpo import GrpoSpec
from finetune_trainer.objectives.grpo.rewards import AnswerReward, FormatReward, HttpReward, LengthReward, parse_rewards
from finetune_trainer.objectives.grpo.settings import GrpoSettings

REWARDS = [
    {"name": "right", "answer": {"field": "answer", "pattern": "answer is (\\d+)"}},
    {"name": "tidy", "weight": 0.2, "format": {"pattern": "^<think>.*</think>"}},
    {"name": "short", "weight": -0.1, "length": {"target": 200}},
    {"name": "judge", "http": {"url": "http://judge.team-a:8080/score", "timeoutSeconds": 5, "batchSize": 8}},
]


def test_the_blocks_defaults_are_the_trainers() -> None:
    assert GrpoSettings(**GrpoSpec().as_settings()) == GrpoSettings()
    assert set(GrpoSpec().as_settings()) == {f.name for f in dataclasses.fields(GrpoSettings)}


def test_a_written_block_gives_the_trainers_settings_and_rewards() -> None:
    block = GrpoSpec.model_validate(
        {"numGenerations": 4, "epsilonHigh": 0.28, "lossType": "bnpo", "scaleRewards": "none", "rewards": REWARDS}
    )
    settings = GrpoSettings(**block.as_settings())
    assert (settings.num_generations, settings.clip_high, settings.loss_type, settings.scale_rewards) == (
        4,
        0.28,
        "bnpo",
        "none",
    )
    rewards = parse_rewards(block.reward_settings())
    assert [type(r) for r in rewards] == [AnswerReward, FormatReward, LengthReward, HttpReward]
    assert [(r.name, r.weight) for r in rewards] == [("right", 1.0), ("tidy", 0.2), ("short", -0.1), ("judge", 1.0)]
    judge = rewards[-1]
    assert isinstance(judge, HttpReward) and (judge.timeout_seconds, judge.batch_size) == (5.0, 8)

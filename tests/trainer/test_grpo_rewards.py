"""GRPO's rewards (objectives/grpo/rewards): each kind on hand-made completions, the weighted sum,
the figures, the settings' one-line errors, and the `http` reward against a real local service.

The rewards are torch-free (`test_the_rewards_import_nothing_of_the_trainers_stack`); counting
tokens is the trainer's tokenizer's job, passed in as `count_tokens`. Most tests here count words
(`len(text.split())`) and need no tokenizer; the three marked `trainer` load TRL or the tiny
model's tokenizer: `format` against TRL's own `think_format_reward`, the figures against TRL's own
`nanstd` (what its GRPOTrainer logs `reward_std` and `rewards/<name>/std` with), and `length`
counted by a real tokenizer. The module as a whole is still `trainer` tier: importing anything
under `finetune_trainer.objectives` runs that package's `__init__`, which imports torch.
"""

from __future__ import annotations

import ast
import json
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from finetune_api.reasons import ExitReason
from finetune_trainer.failures import TrainerFailure
from finetune_trainer.objectives.grpo import rewards as rewards_package
from finetune_trainer.objectives.grpo.rewards import (
    AnswerReward,
    Completions,
    FormatReward,
    HttpReward,
    LengthReward,
    RewardFailed,
    RewardSettingsInvalid,
    Scores,
    figures,
    parse_rewards,
    score,
    sum_names,
)
from tests.support.tiers import HEAVY


def words(text: str) -> int:
    return len(text.split())


def batch(completions: Sequence[str], records: Sequence[dict[str, Any]] | None = None) -> Completions:
    records = list(records) if records is not None else [{"answer": ""} for _ in completions]
    prompts = [f"question {i}" for i in range(len(completions))]
    return Completions(prompts, list(completions), records, words)


def one(rewards: Sequence[Any], completions: Sequence[str], records: Sequence[dict[str, Any]] | None = None) -> Scores:
    """Score with one group holding every completion."""
    return score(rewards, batch(completions, records), len(completions))


def failure(rewards: Sequence[Any], the_batch: Completions, groups: int = 1) -> RewardFailed:
    with pytest.raises(RewardFailed) as caught:
        score(rewards, the_batch, len(the_batch) // groups)
    return caught.value


# --- the kinds -----------------------------------------------------------------------------------


def test_answer_takes_the_patterns_first_group_and_compares_trimmed() -> None:
    reward = parse_rewards([{"name": "right", "answer": {"field": "answer", "pattern": r"answer is (\S+)"}}])
    completions = [
        "so the answer is 42",  # group equals the field
        "the answer is 41",  # another answer
        "no answer here",  # no match
        "answer is 42 and the answer is 7",  # the first match counts
        "The answer is 42",  # an integer field compares as its digits
    ]
    records: list[dict[str, Any]] = [
        {"answer": " 42 "},
        {"answer": "42"},
        {"answer": "42"},
        {"answer": "42"},
        {"answer": 42},
    ]
    assert one(reward, completions, records).values == ((1.0, 0.0, 0.0, 1.0, 1.0),)


def test_answer_without_groups_takes_the_whole_match_and_without_pattern_the_whole_completion() -> None:
    rewards = parse_rewards(
        [
            {"name": "digits", "answer": {"field": "answer", "pattern": r"\d+"}},
            {"name": "whole", "answer": {"field": "answer"}},
            {"name": "optional", "answer": {"field": "answer", "pattern": r"(x)?\d+"}},
        ]
    )
    completions = ["it is 42.", "  42\n", "7"]
    scores = one(rewards, completions, [{"answer": "42"}, {"answer": "42"}, {"answer": "7"}])
    assert scores.values[0] == (1.0, 1.0, 1.0)  # the whole match: '42', '42', '7'
    assert scores.values[1] == (0.0, 1.0, 1.0)  # the whole completion, trimmed
    assert scores.values[2] == (0.0, 0.0, 0.0)  # a first group that took no part ('7') is no answer


def test_format_searches_with_dotall() -> None:
    rewards = parse_rewards([{"name": "tidy", "format": {"pattern": "^<think>.*</think>"}}])
    completions = [
        "<think>step one\nstep two</think> 4",  # `.` crosses the line break
        "sure. <think>late</think>",  # `^` is the completion's start only
        "<think>never closed",
        "x\n<think>a</think>",  # no MULTILINE: `^` does not match after a line break
    ]
    assert one(rewards, completions).values == ((1.0, 0.0, 0.0, 0.0),)


def test_length_is_the_documented_linear_penalty_clipped_at_minus_one() -> None:
    rewards = parse_rewards([{"name": "short", "length": {"target": 4}}])
    completions = ["a b c d", "a b", "a b c d e f", "a " * 8, "a " * 30, ""]
    counts = [words(text) for text in completions]
    expected = tuple(max(-1.0, -abs(n - 4) / 4) for n in counts)
    assert one(rewards, completions).values == (expected,)
    assert expected == (0.0, -0.5, -0.5, -1.0, -1.0, -1.0)  # the formula's shape: 0 at the target, -1 floor


# --- the sum and the figures ---------------------------------------------------------------------


@dataclass(frozen=True)
class Fixed:
    """A reward that returns the values it is given (or raises what it is given)."""

    name: str
    weight: float
    values: Sequence[object] = ()
    raises: BaseException | None = None
    calls: list[int] = field(default_factory=list)

    def score(self, the_batch: Completions) -> Sequence[object]:
        self.calls.append(len(the_batch))
        if self.raises is not None:
            raise self.raises
        return self.values


def test_the_total_is_the_weighted_sum_and_each_reward_keeps_its_own_values() -> None:
    a = Fixed("a", 1.0, [1, 0, 1, 0])
    b = Fixed("b", -2.0, [0.5, 0.25, 0.0, 1.0])
    scores = score([a, b], batch(["w", "x", "y", "z"]), 2)
    assert scores.values == ((1.0, 0.0, 1.0, 0.0), (0.5, 0.25, 0.0, 1.0))
    assert scores.totals == (0.0, -0.5, 1.0, -2.0)  # 1*a - 2*b by hand
    assert scores.groups() == [(0.0, -0.5), (1.0, -2.0)]


def test_the_figures_name_each_rewards_mean_and_the_spread_within_groups() -> None:
    a = Fixed("right-answer", 1.0, [1, 0, 1, 1, 0, 0])
    b = Fixed("short", 0.5, [-1, -0.5, 0, 0, 0, 0])
    scores = score([a, b], batch(list("uvwxyz")), 3)
    found = figures(scores.names, scores.sums())
    totals = [1 - 0.5, 0 - 0.25, 1 + 0, 1 + 0, 0, 0]
    assert found["rewards/right-answer/mean"] == pytest.approx(statistics.mean([1, 0, 1, 1, 0, 0]))
    assert found["rewards/short/mean"] == pytest.approx(statistics.mean([-1, -0.5, 0, 0, 0, 0]))
    assert found["rewards/short/std"] == pytest.approx(statistics.stdev([-1, -0.5, 0, 0, 0, 0]))
    assert found["reward"] == pytest.approx(statistics.mean(totals))
    assert found["reward_std"] == pytest.approx(statistics.stdev(totals))
    spreads = [statistics.stdev(totals[:3]), statistics.stdev(totals[3:])]
    assert found["reward_group_std"] == pytest.approx(statistics.mean(spreads))
    assert found["frac_reward_zero_std"] == pytest.approx(0.0)
    assert set(found) == {
        "rewards/right-answer/mean",
        "rewards/right-answer/std",
        "rewards/short/mean",
        "rewards/short/std",
        "reward",
        "reward_std",
        "reward_group_std",
        "frac_reward_zero_std",
    }
    assert len(scores.sums()) == len(sum_names(scores.names))


def test_sums_of_two_parts_give_the_figures_of_the_whole() -> None:
    """What the loop does over micro-batches and ranks: add the sums, then take the figures."""
    values = [0.0, 1.0, 1.0, 1.0, 0.2, 0.4, 3.0, 3.0]
    whole = score([Fixed("r", 1.5, values)], batch(["c"] * 8), 2)
    first = score([Fixed("r", 1.5, values[:4])], batch(["c"] * 4), 2)
    second = score([Fixed("r", 1.5, values[4:])], batch(["c"] * 4), 2)
    added = [x + y for x, y in zip(first.sums(), second.sums(), strict=True)]
    assert figures(("r",), added) == pytest.approx(figures(("r",), whole.sums()))
    assert figures(("r",), added)["frac_reward_zero_std"] == pytest.approx(0.5)  # (1, 1) and (3, 3)


# TRL's `nanstd` takes Bessel's factor count / (count - 1) from integer tensors, which torch divides
# in float32 even where the values are float64: its standard deviations agree to float32's precision.
FLOAT32 = 1e-6


@pytest.mark.trainer
def test_the_figures_equal_trls_nanstd_and_nanmean() -> None:
    import torch
    from trl.trainer.utils import nanstd

    generator = torch.Generator().manual_seed(5)
    per_func = torch.rand(12, 3, generator=generator, dtype=torch.float64).round(decimals=2)
    per_func[0:4, 0] = 0.5  # one group with no spread
    per_func[0:4, 1:] = 0.0
    weights = [1.0, 0.2, -0.7]
    rewards = [Fixed(f"r{k}", weights[k], per_func[:, k].tolist()) for k in range(3)]
    found = figures(*((s := score(rewards, batch(["c"] * 12), 4)).names, s.sums()))
    totals = torch.tensor(s.totals, dtype=torch.float64)
    for k in range(3):
        assert found[f"rewards/r{k}/mean"] == pytest.approx(torch.nanmean(per_func[:, k]).item(), abs=1e-12)
        assert found[f"rewards/r{k}/std"] == pytest.approx(nanstd(per_func[:, k]).item(), rel=FLOAT32)
    assert found["reward"] == pytest.approx(torch.nanmean(totals).item(), abs=1e-12)
    assert found["reward_std"] == pytest.approx(nanstd(totals).item(), rel=FLOAT32)
    group_std = nanstd(totals.view(-1, 4), dim=1)
    assert found["reward_group_std"] == pytest.approx(group_std.mean().item(), rel=FLOAT32)
    zero = torch.isclose(group_std, torch.zeros_like(group_std)).double().mean().item()
    assert found["frac_reward_zero_std"] == pytest.approx(zero) and zero == pytest.approx(1 / 3)


# --- failures, each one line naming the reward ---------------------------------------------------


@pytest.mark.parametrize(
    ("reward", "said"),
    [
        (Fixed("boom", 1.0, raises=ValueError("bad\n  thing")), "reward 'boom' failed: ValueError: bad thing"),
        (Fixed("few", 1.0, [1.0]), "reward 'few' failed: returned 1 rewards for 2 completions"),
        (Fixed("text", 1.0, [1.0, "x"]), "reward 'text' failed: returned 'x' for completion 1, not a finite number"),
        (Fixed("none", 1.0, [None, 1.0]), "reward 'none' failed: returned None for completion 0, not a finite number"),
        (Fixed("nan", 1.0, [1.0, math.nan]), "reward 'nan' failed: returned nan for completion 1, not a finite number"),
        (Fixed("bool", 1.0, [True, 1.0]), "reward 'bool' failed: returned True for completion 0, not a finite number"),
    ],
)
def test_a_failing_reward_fails_in_one_line_naming_it(reward: Fixed, said: str) -> None:
    fine = Fixed("fine", 1.0, [1.0, 1.0])
    failed = failure([fine, reward], batch(["a", "b"]))
    assert failed.message == said and "\n" not in str(failed)
    assert failed.reward == reward.name
    assert isinstance(failed, TrainerFailure) and failed.reason is ExitReason.TrainerError  # retried, resumed


def test_a_record_without_the_field_or_with_another_type_fails_the_answer_reward() -> None:
    reward = parse_rewards([{"name": "right", "answer": {"field": "answer"}}])
    assert failure(reward, batch(["1", "2"], [{"answer": "1"}, {"other": "2"}])).message == (
        "reward 'right' failed: completion 1: its record has no field 'answer'"
    )
    assert failure(reward, batch(["1", "2"], [{"answer": [1]}, {"answer": "2"}])).message == (
        "reward 'right' failed: completion 0: its record's 'answer' is list, not a string or an integer"
    )


def test_a_token_counter_that_fails_fails_the_length_reward() -> None:
    def broken(text: str) -> int:
        raise RuntimeError("tokenizer gone")

    reward = [LengthReward("short", 1.0, 10)]
    assert failure(reward, Completions(["p"], ["c"], [{}], broken)).message == (
        "reward 'short' failed: RuntimeError: tokenizer gone"
    )
    assert failure(reward, Completions(["p"], ["c"], [{}], lambda text: -1)).message == (
        "reward 'short' failed: completion 0: the token count is -1, not a count"
    )


def test_a_long_cause_is_cut_to_one_short_line() -> None:
    failed = failure([Fixed("long", 1.0, raises=ValueError("x\n" * 2000))], batch(["a"]))
    assert len(failed.message) <= 500 and "\n" not in failed.message and failed.message.endswith("...")


def test_groups_must_divide_the_batch() -> None:
    with pytest.raises(ValueError, match="not groups of 2"):
        score([Fixed("r", 1.0, [1, 1, 1])], batch(["a", "b", "c"]), 2)


# --- the settings ---------------------------------------------------------------------------------

ISSUE_EXAMPLE = r"""
rewards:
  - {name: right-answer, weight: 1.0, answer: {field: answer, pattern: "answer is (\\S+)"}}
  - {name: tidy, weight: 0.2, format: {pattern: "^<think>.*</think>"}}
  - {name: short, weight: 0.1, length: {target: 200}}
  - {name: judge, weight: 1.0, http: {url: "http://judge.team-a:8080/score"}}
"""


def test_the_issues_example_parses_into_its_four_kinds() -> None:
    answer, tidy, short, judge = parse_rewards(yaml.safe_load(ISSUE_EXAMPLE)["rewards"])
    assert isinstance(answer, AnswerReward) and answer.field == "answer" and answer.weight == 1.0
    assert answer.pattern is not None and answer.pattern.pattern == r"answer is (\S+)"
    assert isinstance(tidy, FormatReward) and tidy.weight == 0.2 and tidy.pattern.pattern == "^<think>.*</think>"
    assert isinstance(short, LengthReward) and short.target == 200 and short.weight == 0.1
    assert isinstance(judge, HttpReward) and judge.url == "http://judge.team-a:8080/score"
    assert (judge.timeout_seconds, judge.batch_size) == (30.0, 64)
    assert [r.name for r in (answer, tidy, short, judge)] == ["right-answer", "tidy", "short", "judge"]


def test_weight_defaults_to_one() -> None:
    assert parse_rewards([{"name": "t", "format": {"pattern": "x"}}])[0].weight == 1.0


W = "spec.training.grpo.rewards"
GOOD = {"name": "ok", "format": {"pattern": "x"}}


@pytest.mark.parametrize(
    ("entries", "said"),
    [
        (
            [GOOD, {"name": "tidy", "format": {"pattern": "(<think>"}}],
            f"{W}[1].format.pattern: not a regular expression: ",
        ),
        (
            [{"name": "r", "answer": {"field": "a", "pattern": "["}}],
            f"{W}[0].answer.pattern: not a regular expression: ",
        ),
        (
            [{"name": "r", "format": {"pattern": "x", "flags": "i"}}],
            f"{W}[0].format.flags: not a field here (fields: pattern)",
        ),
        ([{"name": "r", "answer": {"pattern": "x"}}], f"{W}[0].answer.field: required"),
        (
            [{"name": "r", "format": {"pattern": "x"}, "length": {"target": 3}}],
            f"{W}[0]: needs exactly one of answer, format, length, http (has format, length)",
        ),
        ([{"name": "r", "weight": 1}], f"{W}[0]: needs exactly one of answer, format, length, http (has none)"),
        ([{"format": {"pattern": "x"}}], f"{W}[0].name: required"),
        ([{"name": "a b", "format": {"pattern": "x"}}], f"{W}[0].name: 'a b': letters, digits"),
        ([GOOD, GOOD], f"{W}[1].name: 'ok' names another reward already"),
        (
            [{"name": "r", "weight": "high", "format": {"pattern": "x"}}],
            f"{W}[0].weight: expected a finite number, got 'high'",
        ),
        (
            [{"name": "r", "weight": math.inf, "format": {"pattern": "x"}}],
            f"{W}[0].weight: expected a finite number, got inf",
        ),
        ([{"name": "r", "length": {"target": 0}}], f"{W}[0].length.target: expected an integer of at least 1, got 0"),
        (
            [{"name": "r", "length": {"target": 2.5}}],
            f"{W}[0].length.target: expected an integer of at least 1, got 2.5",
        ),
        (
            [{"name": "r", "http": {"url": "ftp://judge/score"}}],
            f"{W}[0].http.url: expected an http:// or https:// URL",
        ),
        (
            [{"name": "r", "http": {"url": "http://j", "timeoutSeconds": 0}}],
            f"{W}[0].http.timeoutSeconds: must be greater than 0",
        ),
        (
            [{"name": "r", "http": {"url": "http://j", "batchSize": 0}}],
            f"{W}[0].http.batchSize: expected an integer of at least 1",
        ),
        ([{"name": "r", "format": "x"}], f"{W}[0].format: expected a mapping, got str"),
        (["tidy"], f"{W}[0]: expected a mapping, got str"),
        ([], f"{W}: needs at least one reward"),
        ({"name": "r"}, f"{W}: expected a list of rewards, got dict"),
    ],
)
def test_a_wrong_setting_is_one_line_naming_its_field(entries: object, said: str) -> None:
    with pytest.raises(RewardSettingsInvalid) as caught:
        parse_rewards(entries)
    assert caught.value.message.startswith(said), caught.value.message
    assert "\n" not in caught.value.message and caught.value.reason is ExitReason.InvalidConfig


# --- the http reward against a real service -------------------------------------------------------


@dataclass
class Service:
    """A scoring service on 127.0.0.1: `answer(body)` gives (status, payload bytes) per call."""

    answer: Callable[[dict[str, Any]], tuple[int, bytes]]
    calls: list[dict[str, Any]] = field(default_factory=list)
    delay: float = 0.0
    url: str = ""


def _handler(service: Service) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            service.calls.append({"body": body, "type": self.headers["Content-Type"], "path": self.path})
            time.sleep(service.delay)
            status, payload = service.answer(body)
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def by_length(body: dict[str, Any]) -> tuple[int, bytes]:
    """The test service's reward: the completion's length in characters, plus the record's `bonus`."""
    rewards = [len(c) + r.get("bonus", 0) for c, r in zip(body["completions"], body["records"], strict=True)]
    return 200, json.dumps({"rewards": rewards}).encode()


@pytest.fixture
def service() -> Iterator[Service]:
    found = Service(by_length)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(found))
    found.url = f"http://127.0.0.1:{server.server_address[1]}/score"
    # A short poll so that shutdown() at teardown returns at once, not after its default 0.5 s.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield found
    server.shutdown()
    server.server_close()


def judge(url: str, **settings: Any) -> tuple[Any, ...]:
    return parse_rewards([{"name": "judge", "weight": 2.0, "http": {"url": url, **settings}}])


def test_http_sends_prompts_completions_records_in_batches(service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy named by the environment is not used: the service is reached directly.
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    completions = ["a", "bb", "ccc", "dddd", "e", "ff", "g"]
    records = [{"prompt": f"question {i}", "bonus": i} for i in range(7)]
    scores = score(judge(service.url, batchSize=3), batch(completions, records), 7)
    assert scores.values == (tuple(float(len(c) + i) for i, c in enumerate(completions)),)
    assert scores.totals == tuple(2.0 * v for v in scores.values[0])
    assert [len(call["body"]["completions"]) for call in service.calls] == [3, 3, 1]
    first = service.calls[0]
    assert first["type"] == "application/json" and first["path"] == "/score"
    assert first["body"] == {
        "prompts": ["question 0", "question 1", "question 2"],
        "completions": ["a", "bb", "ccc"],
        "records": records[:3],
    }


def test_http_sends_chat_prompts_as_the_dataset_holds_them(service: Service) -> None:
    messages = [{"role": "user", "content": "2+2?"}]
    the_batch = Completions([messages, messages], ["4", "5"], [{"answer": "4"}] * 2, words)
    score(judge(service.url), the_batch, 2)
    assert service.calls[0]["body"]["prompts"] == [messages, messages]


def test_http_timeout_fails_fast_naming_the_reward(service: Service) -> None:
    service.delay = 1.5
    started = time.monotonic()
    failed = failure(judge(service.url, timeoutSeconds=0.2), batch(["a", "b"]))
    assert time.monotonic() - started < 1.2  # not waiting for the service, nor retrying
    assert failed.message == f"reward 'judge' failed: {service.url} did not answer within 0.2 s"
    assert len(service.calls) == 1


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (
            lambda body: (500, b"judge crashed\nTraceback ..."),
            "answered HTTP 500 Internal Server Error: judge crashed Traceback ...",
        ),
        (lambda body: (503, b""), "answered HTTP 503 Service Unavailable"),
        (lambda body: (200, json.dumps({"rewards": [1.0]}).encode()), "answered 1 rewards for 2 completions"),
        (
            lambda body: (200, json.dumps({"rewards": [1.0, "high"]}).encode()),
            'answered "high" at 1, not a finite number',
        ),
        (lambda body: (200, b'{"rewards": [1.0, NaN]}'), "answered NaN at 1, not a finite number"),
        (
            lambda body: (200, json.dumps({"scores": [1, 2]}).encode()),
            'answered without a "rewards" list: {"scores": [1, 2]}',
        ),
        (lambda body: (200, b"<html>ok</html>"), "answered no JSON: <html>ok</html>"),
    ],
)
def test_a_service_answering_wrong_fails_the_step_in_one_line(
    service: Service, answer: Callable[[dict[str, Any]], tuple[int, bytes]], said: str
) -> None:
    service.answer = answer
    failed = failure(judge(service.url), batch(["a", "b"]))
    assert failed.message == f"reward 'judge' failed: {service.url} {said}"
    assert len(service.calls) == 1  # no retry


def test_a_service_that_is_not_there_fails_in_one_line() -> None:
    with socket_closed() as port:
        failed = failure(judge(f"http://127.0.0.1:{port}/score"), batch(["a"]))
    assert failed.message.startswith(f"reward 'judge' failed: cannot reach http://127.0.0.1:{port}/score: ")
    assert "refused" in failed.message.lower()


class socket_closed:
    """A local port nothing listens on: bound, then closed, so a connect is refused."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]
        return port

    def __exit__(self, *args: object) -> None:
        pass


# --- torch stays out -----------------------------------------------------------------------------

REWARDS = Path(rewards_package.__file__).parent


def _imports(path: Path) -> set[str]:
    """Every module a file imports, anywhere in it, relative imports made absolute."""
    package = "finetune_trainer." + ".".join(path.parent.relative_to(REWARDS.parents[2]).parts)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            anchor = package.split(".")[: len(package.split(".")) - max(node.level - 1, 0)] if node.level else []
            found.add(".".join([*anchor, node.module] if node.module else anchor))
    return found


def test_the_rewards_import_nothing_of_the_trainers_stack() -> None:
    """Text and numbers only: no torch (nor what loads it), and of the project only the API and the
    trainer's failure type, so the settings can be checked where torch is not installed once the
    objectives' package stops loading it."""
    files = sorted(REWARDS.glob("*.py"))
    assert len(files) >= 5
    for path in files:
        for name in _imports(path):
            assert name.split(".")[0] not in HEAVY, f"{path.name} imports {name}"
            if name.startswith("finetune_trainer."):
                assert name == "finetune_trainer.failures" or name.startswith(rewards_package.__name__), (
                    f"{path.name} imports {name}"
                )


# --- against TRL and a real tokenizer (trainer tier) ---------------------------------------------


@pytest.mark.trainer
def test_format_agrees_with_trls_think_format_reward() -> None:
    """TRL's reward uses re.match with DOTALL | MULTILINE and its own pattern; `format` searches with
    DOTALL: with that pattern (anchored by `^` at the start) both must score every completion alike."""
    from trl.rewards import think_format_reward

    pattern = r"^<think>(?!.*<think>)(.*?)</think>.*$"
    completions = [
        "<think>\nreasoning\n</think>\nanswer",
        "<think>\nreasoning\nanswer",
        "<think>a</think><think>b</think>",
        "preamble <think>a</think>",
        "<think></think>",
        "\n<think>a</think>",
        "<think>x\n</think>\n\n",
    ]
    ours = one(parse_rewards([{"name": "think", "format": {"pattern": pattern}}]), completions).values[0]
    theirs = think_format_reward([[{"content": text}] for text in completions])
    assert list(ours) == theirs
    assert 0 < sum(theirs) < len(theirs)  # both outcomes are in play


@pytest.mark.trainer
def test_length_counts_with_the_trainers_tokenizer() -> None:
    from tests.support.families import tokenizer

    tok = tokenizer()

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    completions = ["the cat sat on the mat", "a", "the quick brown fox jumps over the lazy dog " * 3]
    target = count(completions[0])
    scores = score(
        parse_rewards([{"name": "short", "length": {"target": target}}]),
        Completions(["p"] * 3, completions, [{}] * 3, count),
        3,
    )
    expected = tuple(max(-1.0, -abs(count(text) - target) / target) for text in completions)
    assert scores.values == (expected,)
    assert expected[0] == 0.0 and -1.0 < expected[1] < 0.0 and expected[2] == -1.0

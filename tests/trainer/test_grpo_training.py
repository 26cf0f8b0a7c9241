"""GRPO (`training.method: grpo`) through the real trainer on the tiny model: it learns a
verifiable reward the base rarely earns, with the reward in the trainer and served over HTTP.

The task: prompts from finetune_trainer.model.tiny_model.write_prompts, and a `format` reward of
1 where the completion starts with a capital letter. The tiny model's vocabulary is near-uniform
at first (about one completion in ten starts so), so the base's mean reward is low; the policy
gradient raises the capital-letter tokens' probability within a few steps. Thresholds are the
mean reward of the first 3 steps against the last 3 of 16. Measured (training.seed 42, 7, 1234):
0.09 -> 0.70, 0.12 -> 0.93, 0.09 -> 0.81; the HTTP reward scores as the format reward does, so
its run is seed 42's exactly.
"""

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from finetune_trainer.model.tiny_model import write_prompts
from tests.support.faults import faults_env

from .conftest import JobDir, Run
from .test_parallel import run_job, summary

pytestmark = pytest.mark.trainer

STEPS = 16
PROMPTS_PER_STEP = 4
GENERATIONS = 8
PROMPTS = "prompts.jsonl"
CAPITAL = r"^\s*[A-Z]"
BASE_MEAN_AT_MOST = 0.35
TUNED_MEAN_AT_LEAST = 0.6
RISE_AT_LEAST = 0.3


@pytest.fixture(scope="module")
def prompt_assets(tiny_assets: Path) -> Path:
    datasets = tiny_assets / "datasets"
    if not (datasets / PROMPTS).is_file():
        write_prompts(datasets / PROMPTS)
    return tiny_assets


def grpo_spec(rewards: list[dict[str, Any]], seed: int = 42, **grpo: Any) -> dict[str, Any]:
    settings = {"numGenerations": GENERATIONS, "maxCompletionLength": 4, "rewards": rewards, **grpo}
    return {
        "dataset": {"source": {"pvc": {"claimName": "datasets", "path": PROMPTS}}, "format": "prompt"},
        "training": {
            "method": "grpo",
            "grpo": settings,
            "maxSteps": STEPS,
            "batchSize": PROMPTS_PER_STEP,
            "gradientAccumulation": 1,
            "learningRate": 3.0e-2,
            "warmupRatio": 0.0,
            "seed": seed,
        },
        "checkpoints": {"everySteps": 8, "keep": 2},
        "output": {"samples": {"count": 1, "maxNewTokens": 8}},
    }


def rewards_by_step(run: Run) -> dict[int, float]:
    return {e["step"]: e["reward"] for e in run.of("progress")}


def assert_learned(run: Run) -> tuple[float, float]:
    assert run.code == 0, run.stderr[-3000:]
    rewards = rewards_by_step(run)
    assert sorted(rewards) == list(range(1, STEPS + 1))
    first = sum(rewards[s] for s in (1, 2, 3)) / 3
    last = sum(rewards[s] for s in (STEPS - 2, STEPS - 1, STEPS)) / 3
    print(f"grpo mean reward: steps 1-3 {first:.3f}, steps {STEPS - 2}-{STEPS} {last:.3f}; every step {rewards}")
    assert first <= BASE_MEAN_AT_MOST, rewards
    assert last >= TUNED_MEAN_AT_LEAST, rewards
    assert last - first >= RISE_AT_LEAST, rewards
    return first, last


@pytest.mark.parametrize("seed", [42, 7])
def test_grpo_raises_a_reward_the_base_rarely_earns(tmp_path: Path, prompt_assets: Path, seed: int) -> None:
    spec = grpo_spec([{"name": "capital", "format": {"pattern": CAPITAL}}], seed=seed)
    job, run = run_job(tmp_path, prompt_assets, spec)
    assert_learned(run)
    progress = run.of("progress")[-1]
    for name in ("rewards/capital/mean", "reward_std", "reward_group_std", "completions/mean_length"):
        assert name in progress, progress
    assert progress["completions"] == STEPS * PROMPTS_PER_STEP * GENERATIONS
    done = summary(job)
    assert done["finalStep"] == STEPS
    assert done["finalMetrics"]["reward"] == pytest.approx(progress["reward"])
    precision = done["precisionGuard"]
    assert precision["halfParameters"] == precision["halfActivations"] == 0


class Capitals(BaseHTTPRequestHandler):
    """A reward service: 1.0 per completion that starts with a capital letter, as the format
    reward scores it, read from the batch's JSON body."""

    calls: ClassVar[list[int]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Capitals.calls.append(len(body["completions"]))
        scores = [1.0 if re.search(CAPITAL, text) else 0.0 for text in body["completions"]]
        payload = json.dumps({"rewards": scores}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *_: Any) -> None:
        return


@pytest.fixture
def reward_server() -> Iterator[str]:
    """The service's local address (host:port)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Capitals)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_grpo_learns_a_reward_served_over_http(tmp_path: Path, prompt_assets: Path, reward_server: str) -> None:
    """The job names the Service `judge` as a pod would; outside the cluster there is no Service
    DNS, so the trainer's fault seam sends the calls to the test's server (FINETUNE_TEST_REWARD_HOST)."""
    Capitals.calls.clear()
    rewards = [{"name": "judge", "http": {"url": "http://judge:8080/score", "batchSize": 8}}]
    env = faults_env(FINETUNE_TEST_REWARD_HOST=f"judge={reward_server}")
    _, run = run_job(tmp_path, prompt_assets, grpo_spec(rewards), env=env)
    assert_learned(run)
    # Each step's completions in batches of at most 8.
    assert sum(Capitals.calls) == STEPS * PROMPTS_PER_STEP * GENERATIONS
    assert max(Capitals.calls) <= 8


def samples_of(job: JobDir) -> list[dict[str, Any]]:
    path = job.output / "completions.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]

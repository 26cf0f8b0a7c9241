"""The `http` reward: a scoring service in the job's namespace, called in batches.

Each call is one POST to `url` with `Content-Type: application/json` and the body

    {"prompts": [...], "completions": [...], "records": [...]}

one entry per completion, at most `batchSize` completions a call (the step's completions in
order, G consecutive ones per prompt, so a group may span two calls): a prompt as the dataset
holds it (text or chat messages), the completion's text, the prompt's whole dataset record. The
service answers 200 with `{"rewards": [r1, r2, ...]}`, one finite number per completion of the
call, in its order. Anything else fails the reward at once, the step with it: a status other
than 2xx, no answer within `timeoutSeconds` (each connect and each read), a body that is not that
JSON object, another count, a value that is not a finite number. Nothing is retried: the step
runs again after the resume, and a service that is down says so in one line instead of stalling
every step.

The call goes straight to the service, past any proxy the pod's environment names: the job's
NetworkPolicy lets the trainer reach exactly that service, so a proxy's route would be refused.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .... import faults
from .base import Completions, RewardError, one_line

DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_BATCH_SIZE = 64
# The part of an error page a failure quotes: its first words, not the page.
QUOTED_BODY = 200

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post_json(url: str, payload: dict[str, Any], timeout: float) -> object:
    """POST `payload` as JSON to `url` and return the decoded answer; any failure is a RewardError."""
    try:
        body = json.dumps(payload).encode()
    except (TypeError, ValueError) as exc:
        raise RewardError(f"the completions cannot be sent as JSON: {exc}") from None
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with _DIRECT.open(request, timeout=timeout) as response:
            answer = response.read()
    except urllib.error.HTTPError as exc:
        quoted = exc.read(QUOTED_BODY).decode(errors="replace")
        said = f": {one_line(quoted, QUOTED_BODY)}" if quoted.strip() else ""
        raise RewardError(f"{url} answered HTTP {exc.code} {exc.reason}{said}") from None
    except TimeoutError:  # socket.timeout is TimeoutError since 3.10
        raise RewardError(f"{url} did not answer within {timeout:g} s") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise RewardError(f"{url} did not answer within {timeout:g} s") from None
        raise RewardError(f"cannot reach {url}: {exc.reason}") from None
    except OSError as exc:
        raise RewardError(f"the call to {url} broke off: {exc}") from None
    try:
        return json.loads(answer)
    except ValueError:
        raise RewardError(f"{url} answered no JSON: {one_line(answer.decode(errors='replace'), QUOTED_BODY)}") from None


def rewards_in(answer: object, expected: int, url: str) -> list[float]:
    """The `rewards` list of a service's answer, checked: `expected` finite numbers."""
    rewards = answer.get("rewards") if isinstance(answer, dict) else None
    if not isinstance(rewards, list):
        raise RewardError(f'{url} answered without a "rewards" list: {one_line(json.dumps(answer), QUOTED_BODY)}')
    if len(rewards) != expected:
        raise RewardError(f"{url} answered {len(rewards)} rewards for {expected} completions")
    for index, value in enumerate(rewards):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise RewardError(f"{url} answered {json.dumps(value)} at {index}, not a finite number")
    return [float(value) for value in rewards]


@dataclass(frozen=True)
class HttpReward:
    name: str
    weight: float
    url: str
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    batch_size: int = DEFAULT_BATCH_SIZE

    def score(self, batch: Completions) -> Sequence[float]:
        scores: list[float] = []
        for start in range(0, len(batch), self.batch_size):
            end = min(start + self.batch_size, len(batch))
            payload = {
                "prompts": list(batch.prompts[start:end]),
                "completions": list(batch.completions[start:end]),
                "records": list(batch.records[start:end]),
            }
            answer = post_json(faults.current().reward_url(self.url), payload, self.timeout_seconds)
            scores.extend(rewards_in(answer, end - start, self.url))
        return scores

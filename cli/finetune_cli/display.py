"""How job status reads in a terminal: ages, durations, the progress line and bar."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def age(value: Any, now: datetime | None = None) -> str:
    when = parse_time(value)
    if when is None:
        return "-"
    return duration(((now or datetime.now(UTC)) - when).total_seconds())


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def progress_parts(progress: dict[str, Any] | None) -> list[str]:
    """`step 12/30 (40%)`, `loss 2.310`, `reward acc 0.93 margin 1.2`, `1,234 tok/s`, `ETA 1m05s`:
    whatever is known."""
    if not progress:
        return []
    parts: list[str] = []
    step, total = progress.get("step"), progress.get("totalSteps")
    if isinstance(step, int):
        text = f"step {step}/{total}" if isinstance(total, int) and total else f"step {step}"
        percent = _number(progress.get("percent"))
        if percent is None and isinstance(total, int) and total:
            percent = 100.0 * step / total
        parts.append(text + (f" ({percent:.0f}%)" if percent is not None else ""))
    epoch = _number(progress.get("epoch"))
    if epoch is not None:
        parts.append(f"epoch {epoch:.2f}")
    loss = _number(progress.get("loss"))
    if loss is not None:
        parts.append(f"loss {loss:.4f}")
    # The method's own figures in the trainer's words (dpo, orpo: `reward acc 0.93 margin 1.2`).
    metrics = progress.get("metricsText")
    if isinstance(metrics, str) and metrics:
        parts.append(metrics)
    rate = _number(progress.get("tokensPerSecond"))
    if rate is not None:
        parts.append(f"{rate:,.0f} tok/s")
    eta = _number(progress.get("etaSeconds"))
    if eta is not None:
        parts.append(f"ETA {duration(eta)}")
    return parts


def bar(progress: dict[str, Any] | None, width: int = 24) -> str:
    step = (progress or {}).get("step")
    total = (progress or {}).get("totalSteps")
    if not isinstance(step, int) or not isinstance(total, int) or total <= 0:
        return "[" + "?" * width + "]"
    done = min(width, round(width * step / total))
    return "[" + "#" * done + "-" * (width - done) + "]"


def condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for item in status.get("conditions") or []:
        if isinstance(item, dict) and item.get("type") == kind:
            return item
    return None


def failure_text(status: dict[str, Any]) -> str:
    """`Reason: message` of a failed job, from its Failed condition or its status message."""
    failed = condition(status, "Failed")
    if failed and failed.get("status") == "True":
        reason, message = failed.get("reason") or "Failed", one_line(failed.get("message"))
        return f"{reason}: {message}" if message else reason
    return one_line(status.get("message")) or "failed (no reason recorded)"


def one_line(text: Any) -> str:
    """Messages may quote multi-line output (a termination log); a terminal line holds one."""
    return " ".join(str(text or "").split())


def queue_text(queue: dict[str, Any]) -> str:
    """`team (ClusterQueue gpus), admitted; preempted 1x, last by ns/high`: Kueue's view of the job."""
    where = str(queue.get("name") or "?")
    if queue.get("clusterQueue"):
        where += f" (ClusterQueue {queue['clusterQueue']})"
    state = "admitted" if queue.get("admitted") else f"waiting: {queue.get('reason') or 'Pending'}"
    parts = [f"{where}, {state}"]
    count = queue.get("preemptions")
    if count:
        last = queue.get("lastPreemption") or {}
        by = f", last by {last['by']}" if last.get("by") else ""
        parts.append(f"preempted {count}x{by}")
    return "; ".join(parts)

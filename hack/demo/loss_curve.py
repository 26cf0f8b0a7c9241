"""Plot a training run's loss curve to a PNG: `python -m hack.demo.loss_curve OUT.png SOURCE...`.

A SOURCE is a file or a folder. The points come from whatever the run left behind, in this
order of preference: the trainer's JSON progress lines (`{"event": "progress", "step", "loss"}`,
its stdout, i.e. the pod log), or the Hugging Face `trainer_state.json` (`log_history`) of the
newest checkpoint in an output folder. Both carry the same per-step loss.
"""

import argparse
import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Points = dict[int, float]


def _progress_lines(lines: Iterable[str]) -> Points:
    points: Points = {}
    for line in lines:
        start = line.find("{")
        if start < 0:
            continue
        try:
            record = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("event") == "progress":
            step, loss = record.get("step"), record.get("loss")
            if isinstance(step, int) and isinstance(loss, (int, float)) and math.isfinite(loss):
                points[step] = float(loss)  # a resumed attempt repeats steps: the last one wins
    return points


def _trainer_state(path: Path) -> Points:
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {
        int(entry["step"]): float(entry["loss"])
        for entry in state.get("log_history", [])
        if "loss" in entry and "step" in entry and math.isfinite(float(entry["loss"]))
    }


def _newest_trainer_state(folder: Path) -> Path | None:
    def step_of(path: Path) -> int:
        digits = "".join(c for c in path.parent.name if c.isdigit())
        return int(digits) if digits else -1

    states = sorted(folder.rglob("trainer_state.json"), key=step_of)
    return states[-1] if states else None


def collect(sources: Iterable[Path]) -> Points:
    """Loss by step from every source; progress lines win over checkpoint state."""
    from_logs: Points = {}
    from_state: Points = {}
    for source in sources:
        if source.is_dir():
            for log in sorted(source.rglob("*.log")) + sorted(source.rglob("*.jsonl")):
                from_logs.update(_progress_lines(log.read_text(errors="replace").splitlines()))
            newest = _newest_trainer_state(source)
            if newest is not None:
                from_state.update(_trainer_state(newest))
        elif source.name == "trainer_state.json":
            from_state.update(_trainer_state(source))
        elif source.is_file():
            from_logs.update(_progress_lines(source.read_text(errors="replace").splitlines()))
    return from_logs or from_state


def plot(points: Points, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display where the demo runs
    import matplotlib.pyplot as plt

    steps = sorted(points)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    ax.plot(steps, [points[s] for s in steps], marker="o", markersize=3, linewidth=1.5)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.demo.loss_curve", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="PNG to write")
    parser.add_argument("sources", type=Path, nargs="+", help="pod log files or output folders")
    parser.add_argument("--title", default="FineTuneJob loss")
    args = parser.parse_args(argv)
    points = collect(args.sources)
    if len(points) < 2:
        print(f"loss_curve: fewer than two loss points in {', '.join(map(str, args.sources))}", file=sys.stderr)
        return 1
    plot(points, args.out, args.title)
    first, last = points[min(points)], points[max(points)]
    print(f"{args.out}: {len(points)} steps, loss {first:.3f} -> {last:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""report.html beside the adapter: the page a person reads to see whether the job helped.

One self-contained file (the pictures inlined as data: URIs, the style inline, no script and no
link outside it): it is read from the claim by `ftjob report`, mailed, or opened from a laptop's
downloads folder, where nothing beside it comes along. It holds the run's curves (the loss curve
curves.py drew, and the preference objectives' reward curves from the same TensorBoard history),
the base-against-tuned table of evaluation.json with the better side of each figure marked, the
greedy answers of both beside the reference, and the run's settings and summary. Without an
evaluation.json (no held-out split) it holds the curves and the summary alone.

`report_html` is a pure builder (text in, text out: every value escaped); `write` reads the files
and is, like the loss curve, a courtesy: a report that cannot be written is logged and the job
still succeeds with its adapter.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finetune_api.dotted import dotted_paths
from finetune_api.layout import EVALUATION_FILE, LOSS_CURVE_FILE, REPORT_FILE, TENSORBOARD_DIR

log = logging.getLogger(__name__)

# TRL's names for the preference objectives' implicit reward, as progress.py logs them under train/.
REWARD_PREFIX = "train/rewards/"
# The spec's sections a reader of the report wants beside the figures (the rest is plumbing).
SETTING_SECTIONS = ("model", "dataset", "lora", "quantization", "precision", "training", "evaluation")
# summary.json's figures of the run, in the order the page lists them.
SUMMARY_KEYS = (
    "finalStep",
    "totalSteps",
    "firstLoss",
    "finalLoss",
    "evalLoss",
    "bestEvalLoss",
    "bestEvalStep",
    "tokens",
    "tokensPerSecond",
    "seconds",
    "family",
    "precision",
    "attention",
    "parallelism",
    "worldSize",
    "hardware",
    "adapterPath",
)
# Which way a per-example figure is better: SFT's answer-token loss falls, a preference margin rises.
PER_EXAMPLE_BETTER = {"sft": "lower", "dpo": "higher", "orpo": "higher"}
SIGNIFICANT = 4


@dataclass(frozen=True)
class Picture:
    caption: str
    png: bytes


def number(value: Any) -> str:
    """A figure as the table shows it (4 significant digits); a dash where there is none."""
    if isinstance(value, bool):
        return "true" if value else "false"  # as the spec's YAML spells it
    if not isinstance(value, (int, float)):
        return "—" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{SIGNIFICANT}g}" if math.isfinite(value) else str(value)


def better_side(base: Any, tuned: Any, better: str) -> str | None:
    """'base', 'tuned', 'equal' (the same as shown), or None where a side has no finite number."""
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (base, tuned)):
        return None  # a missing side, or a NaN loss, is no side to mark
    if number(float(base)) == number(float(tuned)):
        return "equal"
    tuned_wins = tuned < base if better == "lower" else tuned > base
    return "tuned" if tuned_wins else "base"


def _text(value: Any) -> str:
    if isinstance(value, (Mapping, list)):
        return json.dumps(value, sort_keys=True, default=str)
    return number(value)


def _rows(pairs: Sequence[tuple[str, Any]]) -> str:
    cells = (f"<tr><th>{html.escape(key)}</th><td>{html.escape(_text(value))}</td></tr>" for key, value in pairs)
    return "<table class='pairs'>" + "".join(cells) + "</table>"


def _figure_row(figure: Mapping[str, Any]) -> tuple[str, str | None]:
    name, better = str(figure.get("name", "?")), str(figure.get("better", "lower"))
    base: Any = figure.get("base")
    tuned: Any = figure.get("tuned")
    side = better_side(base, tuned, better)
    change = ""
    if side is not None and side != "equal":
        delta = float(tuned) - float(base)
        change = f"{delta:+.{SIGNIFICANT}g}" + (f" ({delta / abs(float(base)):+.1%})" if base else "")

    def cell(which: str, value: Any) -> str:
        marked = side == which
        mark = " <span class='mark'>✓ better</span>" if marked else ""
        return f"<td class='{'better' if marked else 'num'}'>{html.escape(number(value))}{mark}</td>"

    verdict = {"tuned": "tuned better", "base": "base better", "equal": "equal", None: "—"}[side]
    row = (
        f"<tr data-figure='{html.escape(name, quote=True)}'><th>{html.escape(name)}</th>"
        f"{cell('base', base)}{cell('tuned', tuned)}<td class='num'>{html.escape(change)}</td>"
        f"<td>{html.escape(better)} is better</td><td>{html.escape(verdict)}</td></tr>"
    )
    return row, side


def _per_example(evaluation: Mapping[str, Any]) -> str:
    """How many held-out examples the tuned model did better on, by the method's own measure."""
    better = PER_EXAMPLE_BETTER.get(str(evaluation.get("method")), "lower")
    sides = [better_side(e.get("base"), e.get("tuned"), better) for e in evaluation.get("perExample") or []]
    counted = [s for s in sides if s is not None]
    if not counted:
        return ""
    return (
        f"<p>Per held-out example: tuned better on {counted.count('tuned')}, base better on "
        f"{counted.count('base')}, equal on {counted.count('equal')} of {len(counted)}.</p>"
    )


def figures_section(evaluation: Mapping[str, Any]) -> str:
    figures = [f for f in evaluation.get("figures") or [] if isinstance(f, Mapping)]
    built = [_figure_row(f) for f in figures]
    sides = [side for _, side in built if side is not None]
    said = (
        f"The tuned model is better on {sides.count('tuned')} of {len(sides)} figures, "
        f"the base on {sides.count('base')}, equal on {sides.count('equal')}."
    )
    where = (
        f"{number(evaluation.get('examples'))} held-out examples ({evaluation.get('split', '?')}), "
        f"method {evaluation.get('method', '?')}, tuned at step {number(evaluation.get('step'))}"
    )
    head = "<tr><th>figure</th><th>base</th><th>tuned</th><th>change</th><th>direction</th><th>verdict</th></tr>"
    return (
        "<h2>Base against tuned</h2>"
        f"<p class='verdict'>{html.escape(said)}</p><p>{html.escape(where)}.</p>"
        f"<table class='figures'>{head}{''.join(row for row, _ in built)}</table>{_per_example(evaluation)}"
    )


def answers_section(evaluation: Mapping[str, Any]) -> str:
    answers = [a for a in evaluation.get("answers") or [] if isinstance(a, Mapping)]
    if not answers:
        return ""
    blocks = []
    for answer in answers:
        columns = "".join(
            f"<td><pre>{html.escape(str(answer.get(key) or ''))}</pre></td>" for key in ("reference", "base", "tuned")
        )
        blocks.append(
            f"<div class='answer' data-index='{html.escape(str(answer.get('index', '')), quote=True)}'>"
            f"<p><b>Held-out example {html.escape(str(answer.get('index', '?')))}</b></p>"
            f"<pre class='prompt'>{html.escape(str(answer.get('prompt') or ''))}</pre>"
            f"<table class='answers'><tr><th>reference</th><th>base</th><th>tuned</th></tr><tr>{columns}</tr></table>"
            "</div>"
        )
    return "<h2>Answers</h2><p>Greedy answers of both models beside the reference.</p>" + "".join(blocks)


def history_section(evaluation: Mapping[str, Any]) -> str:
    history = [h for h in evaluation.get("history") or [] if isinstance(h, Mapping)]
    if not history:
        return ""
    names = sorted({name for h in history for name in (h.get("figures") or {})})
    head = "<tr><th>step</th>" + "".join(f"<th>{html.escape(n)}</th>" for n in names) + "</tr>"
    body = "".join(
        f"<tr><th>{html.escape(number(h.get('step')))}</th>"
        + "".join(f"<td class='num'>{html.escape(number((h.get('figures') or {}).get(n)))}</td>" for n in names)
        + "</tr>"
        for h in history
    )
    return f"<h2>Tuned at checkpoints</h2><table class='figures'>{head}{body}</table>"


STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1100px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
td.num, td.better { text-align: right; font-variant-numeric: tabular-nums; }
td.better { background: #d9f2d9; font-weight: bold; }
.mark { color: #1a7f1a; font-size: 0.85em; }
.verdict { font-weight: bold; }
pre { white-space: pre-wrap; margin: 0; font-size: 0.9em; }
pre.prompt { background: #f4f4f4; padding: 6px; margin-bottom: 4px; }
table.answers { width: 100%; } table.answers td { width: 33%; }
figure { margin: 1em 0; } img { max-width: 100%; border: 1px solid #ddd; }
table.pairs th { font-weight: normal; color: #555; }
"""


def report_html(
    title: str,
    summary: Mapping[str, Any],
    evaluation: Mapping[str, Any] | None,
    pictures: Sequence[Picture],
    settings: Mapping[str, Any],
) -> str:
    """The whole page: curves, the base-against-tuned table and the answers (with an
    evaluation), the settings and the summary. Every value is escaped; nothing refers outside."""
    curves = "".join(
        f"<figure><img alt='{html.escape(p.caption, quote=True)}' "
        f"src='data:image/png;base64,{base64.b64encode(p.png).decode()}'>"
        f"<figcaption>{html.escape(p.caption)}</figcaption></figure>"
        for p in pictures
    )
    parts = [f"<h1>{html.escape(title)}</h1>"]
    if evaluation is None:
        parts.append("<p>No evaluation: the job had no held-out split (dataset.evalFraction or dataset.eval).</p>")
    else:
        parts.append(figures_section(evaluation))
    parts.append("<h2>Curves</h2>" + (curves or "<p>No curve: fewer than two logged steps.</p>"))
    if evaluation is not None:
        parts += [answers_section(evaluation), history_section(evaluation)]
    chosen = [(key, summary[key]) for key in SUMMARY_KEYS if summary.get(key) is not None]
    parts.append("<h2>Summary</h2>" + _rows(chosen))
    parts.append("<h2>Settings</h2>" + _rows(sorted(dotted_paths(settings).items())))
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>"
        f"<body>{''.join(parts)}</body></html>\n"
    )


# --- the files: read, drawn, written ---------------------------------------------------------------
def read_rewards(tensorboard: Path) -> dict[str, dict[int, float]]:
    """The implicit-reward scalars of every attempt (`rewards/margins` -> step -> value), read as
    curves.py reads the loss; empty for a method without them or a run without TensorBoard files."""
    if not tensorboard.is_dir():
        return {}
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator  # type: ignore[import-untyped]

    logging.getLogger("tensorboard").setLevel(logging.WARNING)
    events = EventAccumulator(str(tensorboard), size_guidance={SCALARS: 0})
    events.Reload()
    tags = [tag for tag in events.Tags().get("scalars") or () if tag.startswith(REWARD_PREFIX)]
    return {tag.removeprefix("train/"): {int(e.step): float(e.value) for e in events.Scalars(tag)} for tag in tags}


def reward_png(rewards: Mapping[str, Mapping[int, float]], title: str) -> bytes | None:
    """The reward curves by step: the accuracy on its own axis, the margin and chosen/rejected on another."""
    if not any(len(series) >= 2 for series in rewards.values()):
        return None
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7.0, 5.6), dpi=100)
    FigureCanvasAgg(figure)
    accuracy, rewards_axis = figure.subplots(2, 1, sharex=True)
    for tag, series in sorted(rewards.items()):
        steps = sorted(series)
        axis = accuracy if tag.endswith("accuracies") else rewards_axis
        axis.plot(steps, [series[s] for s in steps], linewidth=1.4, label=tag)
    accuracy.set_ylabel("reward accuracy")
    accuracy.set_ylim(-0.05, 1.05)
    rewards_axis.set_ylabel("implicit reward")
    rewards_axis.set_xlabel("optimizer step")
    for axis in (accuracy, rewards_axis):
        axis.grid(True, alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(loc="best")
    accuracy.set_title(title)
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return out.getvalue()


def load_evaluation(output: Path) -> dict[str, Any] | None:
    """evaluation.json of the output folder; None where there is none or it does not parse."""
    path = output / EVALUATION_FILE
    if not path.is_file():
        return None
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        log.warning("report: cannot read %s: %s", path, exc)
        return None
    return loaded if isinstance(loaded, dict) else None


def _pictures(output: Path, summary: Mapping[str, Any], title: str) -> list[Picture]:
    pictures = []
    curve = Path(str(summary.get("lossCurvePath") or output / LOSS_CURVE_FILE))
    if curve.is_file():
        pictures.append(Picture("training and eval loss by step (learning rate dashed)", curve.read_bytes()))
    try:
        drawn = reward_png(read_rewards(output / TENSORBOARD_DIR), title)
    except Exception as exc:  # a broken event file costs the reward picture, never the report
        log.warning("report: cannot draw the reward curves: %s", exc)
        drawn = None
    if drawn is not None:
        pictures.append(Picture("implicit reward by step (accuracy, margin, chosen and rejected)", drawn))
    return pictures


def write(output: Path, summary: Mapping[str, Any], settings: Mapping[str, Any], title: str) -> Path | None:
    """report.html in `output` (written beside, then renamed: never half a file); None where it
    cannot be written."""
    try:
        chosen = {key: settings[key] for key in SETTING_SECTIONS if key in settings}
        page = report_html(title, summary, load_evaluation(output), _pictures(output, summary, title), chosen)
        path = output / REPORT_FILE
        temp = path.with_name(f".{REPORT_FILE}.tmp")
        temp.write_text(page, encoding="utf-8")
        temp.rename(path)
    except Exception as exc:
        log.warning("report: cannot write %s: %s", output / REPORT_FILE, exc)
        return None
    log.info("report written: %s", path)
    return path

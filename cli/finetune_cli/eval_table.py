"""The table of `ftjob eval`: one row per task and metric, one column per model measured (the base,
then each adapter), the numbers as lm-evaluation-harness reported them. Pure: built from the
results dicts `simple_evaluate` returns, and written as text or JSON."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

STDERR = "_stderr"
# lm-evaluation-harness's filter name when a task applies none; other filters are named in the row.
NO_FILTER = "none"


@dataclass
class Row:
    task: str
    metric: str
    samples: int | None
    higher_is_better: bool | None
    values: dict[str, float | None] = field(default_factory=dict)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(float(value)):
        return None
    return float(value)


def _metrics(figures: dict[str, Any]) -> dict[str, float | None]:
    """`exact_match,none` -> `exact_match`; `exact_match,strict` -> `exact_match (strict)`;
    standard errors and the alias left out."""
    found: dict[str, float | None] = {}
    for key, value in figures.items():
        metric, _, kind = key.partition(",")
        if not kind or metric.endswith(STDERR):
            continue
        found[metric if kind == NO_FILTER else f"{metric} ({kind})"] = _number(value)
    return found


def _samples(results: dict[str, Any], task: str) -> int | None:
    counted = (results.get("n-samples") or {}).get(task) or {}
    value = counted.get("effective", counted.get("original"))
    return int(value) if isinstance(value, int) else None


def rows(columns: list[str], runs: dict[str, dict[str, Any]]) -> list[Row]:
    """Rows of every task and metric any run reported, in the order of the first run that has
    them; a cell a run did not report is None."""
    table: dict[tuple[str, str], Row] = {}
    for column in columns:
        results = runs.get(column) or {}
        better_of = results.get("higher_is_better") or {}
        for task, figures in (results.get("results") or {}).items():
            for metric, value in _metrics(figures).items():
                key = (task, metric)
                if key not in table:
                    better = (better_of.get(task) or {}).get(metric.split(" (", 1)[0])
                    better = better if isinstance(better, bool) else None
                    table[key] = Row(task, metric, _samples(results, task), better)
                table[key].values[column] = value
    for row in table.values():
        for column in columns:
            row.values.setdefault(column, None)
    return list(table.values())


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def text(columns: list[str], table: list[Row]) -> str:
    """Aligned columns: TASK METRIC N, then one per model; `↑`/`↓` after a metric says which way is better."""
    head = ["TASK", "METRIC", "N", *(c.upper() if c == "base" else c for c in columns)]
    body = [
        [
            row.task,
            row.metric + {True: " ↑", False: " ↓", None: ""}[row.higher_is_better],
            "-" if row.samples is None else str(row.samples),
            *(_cell(row.values.get(c)) for c in columns),
        ]
        for row in table
    ]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return "\n".join(
        "   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in [head, *body]
    )


def document(server: str, columns: list[str], adapters: dict[str, int], table: list[Row]) -> dict[str, Any]:
    """The JSON of `-o json`: the columns (adapter ids beside the jobs) and each row's numbers."""
    return {
        "server": server,
        "columns": [{"name": c, **({"adapter": adapters[c]} if c in adapters else {})} for c in columns],
        "rows": [
            {
                "task": row.task,
                "metric": row.metric,
                "samples": row.samples,
                "higherIsBetter": row.higher_is_better,
                "values": row.values,
            }
            for row in table
        ],
    }

"""The chart's PrometheusRule and Grafana dashboard as tests read them: the rendered rule groups,
the dashboard's queries, and the metric names both use (for the chart tests and the e2e test
against the operator's own /metrics)."""

import json
import re
from pathlib import Path
from typing import Any

from tests.support.helm import CHART, one, render

DASHBOARD = CHART / "files" / "dashboards" / "finetune-jobs.json"
# Series the rule and dashboard read that the operator does not export (NVIDIA DCGM exporter's).
FOREIGN = frozenset({"DCGM_FI_DEV_GPU_UTIL"})
PROMQL_WORDS = frozenset({"by", "on", "and", "or", "unless", "without", "ignoring", "bool", "offset"})


def rule_groups(sets: list[str]) -> list[dict[str, Any]]:
    """The PrometheusRule's groups, rendered with the rule on and `sets`."""
    groups = one(render(sets=["monitoring.prometheusRule.enabled=true", *sets]), "PrometheusRule")["spec"]["groups"]
    assert isinstance(groups, list)
    return groups


def alerts(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in groups for rule in group["rules"]}


def dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    loaded = json.loads(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


def dashboard_exprs(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside label matchers, strings, ranges,
    `by (...)`-style lists, and not called as functions."""
    bare = re.sub(r'"[^"]*"', "", expr)
    bare = re.sub(r"\{[^}]*\}", "", bare)
    bare = re.sub(r"\b(by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)", "", bare)
    bare = re.sub(r"\[[^\]]*\]", "", bare)
    names = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", bare))
    return {n for n in names if n not in PROMQL_WORDS and not re.fullmatch(r"\d+[smhd]?", n)}


def used_metrics() -> set[str]:
    """Every metric the rule (default values) and the dashboard read, the exporter's own included."""
    exprs = [r["expr"] for r in alerts(rule_groups([])).values()] + dashboard_exprs(dashboard())
    return set().union(*(metric_names(e) for e in exprs))

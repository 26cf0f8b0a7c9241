"""The chart's PrometheusRule and Grafana dashboard, checked by the tools that will read them.

The rule is rendered by `helm template` and handed to the pinned promtool (built once from the
Go module proxy, hack/cluster/binaries.py): `check rules` on the rule, `test rules` on synthetic
series (tests/chart/monitoring/alerts.test.yaml) that make each alert fire and stay silent on
near misses. The dashboard is validated against tests/chart/monitoring/grafana-dashboard.schema.json
with the pinned jsonschema (Grafana ships no JSON Schema of its dashboards; that one is ours, see
its description) and every query in it goes through promtool's PromQL parser. Both only name
metrics the operator exports. No cluster: helm and promtool only (their fixtures, the `tools` tier).
"""

import copy
import json
import re
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from finetune_operator.job_metrics import families
from finetune_operator.metrics import Metrics
from tests.support.helm import by_kind, one, render
from tests.support.monitoring import FOREIGN, alerts, dashboard, dashboard_exprs, rule_groups, used_metrics
from tests.support.promtool import promtool, write_rule_file

HERE = Path(__file__).parent / "monitoring"
UNIT_TESTS = HERE / "alerts.test.yaml"
SCHEMA = HERE / "grafana-dashboard.schema.json"
ALERTS = {"FineTuneJobFailed", "FineTuneJobPendingTooLong", "FineTuneJobNoProgress", "FineTuneJobGpuUnderused"}
# The values alerts.test.yaml is written for.
TESTED = [
    "guardrails.pendingTimeoutSeconds=600",
    "monitoring.prometheusRule.noProgressMinutes=30",
    "monitoring.prometheusRule.gpuUtilization.floorPercent=20",
    "monitoring.prometheusRule.gpuUtilization.forMinutes=15",
]


def _exported() -> set[str]:
    """Every family name the operator's registry serves on /metrics, histogram series included."""
    names: set[str] = set()
    for family in [*Metrics().registry.collect(), *families([])]:
        names.add(family.name)
        if family.type == "histogram":
            names |= {f"{family.name}_bucket", f"{family.name}_sum", f"{family.name}_count"}
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names


@pytest.mark.usefixtures("helm_binary")
def test_monitoring_is_off_by_default() -> None:
    objects = render()
    assert by_kind(objects, "PrometheusRule") == []
    assert not [o for o in by_kind(objects, "ConfigMap") if "grafana_dashboard" in o["metadata"].get("labels", {})]


@pytest.mark.usefixtures("helm_binary", "promtool_binary")
def test_the_rendered_rule_passes_promtool_checkalerts(tmp_path: Path) -> None:
    groups = rule_groups(TESTED)
    assert set(alerts(groups)) == ALERTS
    result = promtool("check", "rules", str(write_rule_file(tmp_path / "rules.yaml", groups)))
    assert result.returncode == 0, result.stderr + result.stdout
    assert "SUCCESS: 4 rules found" in result.stdout + result.stderr


@pytest.mark.usefixtures("helm_binary", "promtool_binary")
def test_promtool_check_rules_refuses_a_broken_expression(tmp_path: Path) -> None:
    """The check above can fail: the same rule with one expression broken does not pass."""
    groups = copy.deepcopy(rule_groups(TESTED))
    groups[0]["rules"][0]["expr"] = "max by (namespace (finetune_job_failed) == 1"
    result = promtool("check", "rules", str(write_rule_file(tmp_path / "rules.yaml", groups)))
    assert result.returncode != 0
    assert "FineTuneJobFailed" in result.stderr + result.stdout or "parse error" in result.stderr + result.stdout


def _unit_test(tmp_path: Path, groups: list[dict[str, Any]], tests: Path = UNIT_TESTS) -> str:
    write_rule_file(tmp_path / "rules.yaml", groups)
    shutil.copy(tests, tmp_path / "alerts.test.yaml")
    result = promtool("test", "rules", "alerts.test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout + result.stderr


@pytest.mark.usefixtures("helm_binary", "promtool_binary")
def test_each_alert_fires_on_its_series_and_stays_silent_on_near_misses(tmp_path: Path) -> None:
    said = _unit_test(tmp_path, rule_groups(TESTED))
    assert "SUCCESS" in said
    tested = {
        t["alertname"] for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"] for t in case["alert_rule_test"]
    }
    assert tested == ALERTS


@pytest.mark.usefixtures("helm_binary", "promtool_binary")
def test_the_unit_tests_fail_when_an_alert_misses_its_series(tmp_path: Path) -> None:
    """promtool test rules can fail: with the floor at 5 % the idle job (10 %) no longer alerts."""
    groups = rule_groups([*TESTED[:-2], "monitoring.prometheusRule.gpuUtilization.floorPercent=5", TESTED[-1]])
    write_rule_file(tmp_path / "rules.yaml", groups)
    shutil.copy(UNIT_TESTS, tmp_path / "alerts.test.yaml")
    result = promtool("test", "rules", "alerts.test.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert "FineTuneJobGpuUnderused" in result.stdout + result.stderr


@pytest.mark.usefixtures("helm_binary", "promtool_binary")
def test_the_gpu_alert_reads_an_exporter_scraped_without_honouring_its_labels(tmp_path: Path) -> None:
    """DCGM exporter scraped with honorLabels off names the GPU's pod `exported_pod` (and its
    namespace `exported_namespace`); the same unit tests pass with the chart told so."""
    cases = yaml.safe_load(UNIT_TESTS.read_text())
    for case in cases["tests"]:
        for series in case["input_series"]:
            if series["series"].startswith("DCGM_"):
                renamed = re.sub(r"\bpod=", "exported_pod=", series["series"])
                series["series"] = re.sub(r"\bnamespace=", "exported_namespace=", renamed)
    exported = tmp_path / "exported.test.yaml"
    exported.write_text(yaml.safe_dump(cases, sort_keys=False))
    sets = [
        *TESTED,
        "monitoring.prometheusRule.gpuUtilization.podLabel=exported_pod",
        "monitoring.prometheusRule.gpuUtilization.namespaceLabel=exported_namespace",
    ]
    assert "SUCCESS" in _unit_test(tmp_path, rule_groups(sets), exported)


@pytest.mark.usefixtures("helm_binary")
@pytest.mark.parametrize(
    ("sets", "pending_for"),
    [
        ([], "1800s"),
        (["guardrails.pendingTimeoutSeconds=600"], "900s"),
        (["guardrails.pendingTimeoutSeconds=600", "monitoring.prometheusRule.pendingSeconds=120"], "120s"),
    ],
    ids=["no-timeout", "timeout-plus-grace", "explicit"],
)
def test_the_pending_alert_waits_past_the_operators_own_timeout(sets: list[str], pending_for: str) -> None:
    rules = alerts(rule_groups(sets))
    assert rules["FineTuneJobPendingTooLong"]["for"] == pending_for


@pytest.mark.usefixtures("helm_binary")
def test_the_service_monitor_keeps_the_jobs_own_namespace_and_pod_labels() -> None:
    """Without honorLabels, Prometheus renames the series' `namespace` and `pod` to `exported_*`
    (the operator pod's own would win) and the alerts' joins would find nothing."""
    monitors = by_kind(render(sets=["metrics.serviceMonitor.enabled=true"]), "ServiceMonitor")
    (monitor,) = [m for m in monitors if not m["metadata"]["name"].endswith("-servers")]
    assert [e.get("honorLabels") for e in monitor["spec"]["endpoints"]] == [True]


@pytest.mark.usefixtures("helm_binary")
def test_the_servers_service_monitor_scrapes_llama_servers_metrics_port_in_every_namespace() -> None:
    """The ModelServers' Services (builders/model_server.py) by their labels and named port."""
    from finetune_api.server_spec import SERVER_PORT_NAME
    from finetune_operator.builders.model_server import ServerOwner, service

    monitors = by_kind(render(sets=["metrics.serviceMonitor.enabled=true"]), "ServiceMonitor")
    (servers,) = [m for m in monitors if m["metadata"]["name"].endswith("-servers")]
    built = service(ServerOwner("chat", "team-a", "uid"))
    assert servers["spec"]["selector"]["matchLabels"].items() <= built["metadata"]["labels"].items()
    assert servers["spec"]["namespaceSelector"] == {"any": True}
    assert [(e["port"], e["path"]) for e in servers["spec"]["endpoints"]] == [(SERVER_PORT_NAME, "/metrics")]
    assert [p["name"] for p in built["spec"]["ports"]] == [SERVER_PORT_NAME]


@pytest.mark.usefixtures("helm_binary")
def test_alert_labels_and_rule_labels_come_from_values() -> None:
    objects = render(
        sets=[
            "monitoring.prometheusRule.enabled=true",
            "monitoring.prometheusRule.labels.release=prometheus",
            "monitoring.prometheusRule.alertLabels.team=ml",
        ]
    )
    rule = one(objects, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert {r["labels"]["team"] for g in rule["spec"]["groups"] for r in g["rules"]} == {"ml"}


@pytest.mark.usefixtures("helm_binary")
def test_the_dashboard_passes_the_schema_and_lands_in_a_configmap_unchanged() -> None:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    board = dashboard()
    jsonschema.Draft202012Validator(schema).validate(board)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    objects = render(sets=["monitoring.grafanaDashboard.enabled=true", "monitoring.grafanaDashboard.namespace=grafana"])
    (configmap,) = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert configmap["metadata"]["namespace"] == "grafana"
    assert json.loads(configmap["data"]["finetune-jobs.json"]) == board


def test_the_schema_refuses_a_panel_grafana_could_not_place() -> None:
    """The schema check can fail: a panel without its grid position, or a misspelt query key."""
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    board = dashboard()
    panel = next(p for p in board["panels"] if p["type"] == "timeseries")
    del panel["gridPos"]
    assert any("gridPos" in e.message for e in validator.iter_errors(board))
    board = dashboard()
    target = next(p for p in board["panels"] if p["type"] == "timeseries")["targets"][0]
    target["exp"] = target.pop("expr")
    assert not validator.is_valid(board)


@pytest.mark.usefixtures("helm_binary", "promtool_binary")
def test_every_dashboard_query_parses_as_promql(tmp_path: Path) -> None:
    """Grafana's variables replaced by what Grafana sends, each query becomes a recording rule
    that promtool parses."""
    exprs = dashboard_exprs(dashboard())
    assert len(exprs) >= 12
    substitute = {"$namespace": ".*", "$job": ".*", "$__rate_interval": "2m"}
    rules = []
    for index, query in enumerate(exprs):
        expr = query
        for variable, value in substitute.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:query_{index}", "expr": expr})
    result = promtool(
        "check", "rules", str(write_rule_file(tmp_path / "queries.yaml", [{"name": "q", "rules": rules}]))
    )
    assert result.returncode == 0, result.stderr + result.stdout


@pytest.mark.usefixtures("helm_binary")
def test_the_rule_and_dashboard_name_only_metrics_the_operator_exports() -> None:
    """Against the operator's registry here; against its served /metrics in
    tests/operator/test_e2e_job_metrics.py."""
    used = used_metrics()
    assert {"finetune_job_failed", "finetune_job_eval_loss", "DCGM_FI_DEV_GPU_UTIL"} <= used  # the parser finds names
    assert used - FOREIGN <= _exported(), sorted(used - FOREIGN - _exported())

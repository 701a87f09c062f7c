"""deploy/prometheus-alerts.yaml and deploy/grafana-dashboard.json: the alerts pass their
promtool unit tests (a one-off violation fires, a plugin answering NOT_FOUND is healthy),
every dashboard expression parses, and the dashboard and the alerts count errors alike."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import require_tool

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "deploy" / "prometheus-alerts.yaml"
ALERT_TESTS = ROOT / "deploy" / "prometheus-alerts.test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana-dashboard.json"


@pytest.fixture(scope="module")
def promtool() -> str:
    return require_tool("promtool", "Debian: apt-get install prometheus")


def rule_groups() -> list[dict[str, object]]:
    groups: list[dict[str, object]] = yaml.safe_load(ALERTS.read_text())["spec"]["groups"]
    return groups


def dashboard_exprs() -> dict[str, str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return {
        f"{panel['title']} #{i}": target["expr"]
        for panel in dashboard["panels"]
        for i, target in enumerate(panel.get("targets", []))
    }


def run_promtool(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_alert_rules_pass_their_promtool_unit_tests(promtool, tmp_path):
    (tmp_path / "prometheus-alerts.rules.yaml").write_text(
        yaml.safe_dump({"groups": rule_groups()})
    )
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    result = run_promtool(promtool, "test", "rules", ALERT_TESTS.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_a_one_off_violation_needs_the_unless_offset_form(promtool, tmp_path):
    """The unit tests can fail: with the plain increase() the one-off violation never fires."""
    groups = rule_groups()
    for group in groups:
        for rule in group["rules"]:  # type: ignore[attr-defined]
            if "violations" in rule["expr"]:
                selector = re.search(r"plugproxy_violations_total\{[^}]*\}", rule["expr"])
                assert selector is not None
                rule["expr"] = (
                    f"sum by (job, instance, spec, rule, level)"
                    f" (increase({selector.group(0)}[30m])) > 0"
                )
    (tmp_path / "prometheus-alerts.rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    result = run_promtool(promtool, "test", "rules", ALERT_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0
    assert "PlugproxyPluginViolationsRising, time: 27m" in result.stdout + result.stderr


def test_every_dashboard_expression_parses(promtool, tmp_path):
    records = [
        {"record": f"dashboard:panel_{i}", "expr": expr.replace("$job", ".*")}
        for i, expr in enumerate(dashboard_exprs().values())
    ]
    path = tmp_path / "dashboard.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    result = run_promtool(promtool, "check", "rules", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _error_codes(expr: str) -> str:
    found = set(re.findall(r'code!~"([^"]+)"', expr))
    assert len(found) == 1, expr
    return found.pop()


def test_dashboard_and_alert_count_the_same_answers_as_errors():
    (alert,) = [
        r["expr"]
        for g in rule_groups()
        for r in g["rules"]  # type: ignore[attr-defined]
        if r["alert"] == "PlugproxyErrorRatioHigh"
    ]
    (panel,) = [e for title, e in dashboard_exprs().items() if title.startswith("Error ratio")]
    assert _error_codes(alert) == _error_codes(panel) == "OK|NOT_FOUND|ALREADY_EXISTS"


def test_latency_panels_draw_only_methods_with_calls():
    """histogram_quantile over a method without calls is NaN: those series are left out."""
    quantiles = [e for e in dashboard_exprs().values() if e.startswith("histogram_quantile(")]
    assert len(quantiles) == 4
    assert all(re.search(r"_count\{[^}]*\}\[5m\]\)\) > 0$", e) for e in quantiles)


def test_violation_panels_and_alerts_count_a_series_from_its_birth():
    exprs = [e for e in dashboard_exprs().values() if "plugproxy_violations_total" in e]
    exprs += [
        r["expr"]
        for g in rule_groups()
        for r in g["rules"]  # type: ignore[attr-defined]
        if "plugproxy_violations_total" in r["expr"]
    ]
    assert len(exprs) == 4
    assert all(re.search(r"unless plugproxy_violations_total\{[^}]*\} offset", e) for e in exprs)

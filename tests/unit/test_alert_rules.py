"""The alert rules (docs/dashboards/scalable-topics.rules.yaml) are valid for Prometheus
(``promtool check rules``), fire exactly where their unit tests say
(``promtool test rules scalable-topics.rules.test.yaml``), query only metrics the operator and
brokers export, and the ``PrometheusRule`` manifest carries the same rules."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from scalable_topics.cli import monitoring
from tests.prometheus_binaries import prometheus_binary

from .test_dashboard import METRIC, exported

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "docs" / "dashboards" / "scalable-topics.rules.yaml"
RULE_TESTS = REPO / "docs" / "dashboards" / "scalable-topics.rules.test.yaml"
MANIFEST = REPO / "manifests" / "monitoring" / "prometheusrule.yaml"


@pytest.fixture(scope="module")
def promtool() -> str:
    return prometheus_binary("promtool")


def _promtool(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def _rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_checks_the_rules(promtool: str) -> None:
    r = _promtool(promtool, "check", "rules", RULES.name, cwd=RULES.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in r.stdout


def test_promtool_unit_tests_of_the_rules_pass(promtool: str) -> None:
    r = _promtool(promtool, "test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert {r["alert"] for r in _rules()} == fired


def test_a_wrong_rule_fails_its_unit_test(promtool: str, tmp_path: Path) -> None:
    """The unit tests can fail: the stuck-operation threshold moved from 10 to 20 minutes."""
    (tmp_path / RULES.name).write_text(RULES.read_text().replace("> 600", "> 1200"))
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    r = _promtool(promtool, "test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert r.returncode != 0
    assert "ScalableTopicOperationStuck" in r.stdout + r.stderr


def test_rules_query_only_exported_metrics() -> None:
    names, _ = exported()
    for rule in _rules():
        used = METRIC.findall(rule["expr"])
        assert used, rule["alert"]
        for name in used:
            assert name in names, f"{rule['alert']}: {name} is not exported"


def test_the_prometheus_rule_manifest_has_the_same_rules() -> None:
    manifest = yaml.safe_load(MANIFEST.read_text())
    assert manifest["kind"] == "PrometheusRule"
    assert manifest["spec"] == yaml.safe_load(RULES.read_text())
    expected = monitoring.render(RULES, RULES.relative_to(REPO).as_posix())
    assert MANIFEST.read_text() == expected, "stale: run make monitoring"


def test_the_monitoring_kustomization_is_not_in_the_base() -> None:
    """prometheus-operator's CRDs are optional: the base must apply without them."""
    base = yaml.safe_load((REPO / "manifests" / "base" / "kustomization.yaml").read_text())
    assert not any("monitoring" in r for r in base["resources"])
    monitoring_kustomization = yaml.safe_load((MANIFEST.parent / "kustomization.yaml").read_text())
    assert set(monitoring_kustomization["resources"]) == {"podmonitor.yaml", "prometheusrule.yaml"}

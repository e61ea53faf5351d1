"""The Grafana dashboard (docs/dashboards/scalable-topics.json) queries only metrics the
operator and the brokers export, grouped by labels they carry, and code of theirs produces
every one of them (a metric only declared leaves its panel empty on a live system)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

import scalable_topics.controller.metrics as operator_metrics
import scalable_topics.controller.transfer  # noqa: F401  (registers LOAD_SHEDS, run alone too)
from segment_broker import metrics as broker_metrics
from segment_broker.load import LoadTracker, ThresholdReporter

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "docs" / "dashboards" / "scalable-topics.json"
SOURCES = (REPO / "operator" / "scalable_topics", REPO / "broker-image" / "segment_broker")
METRIC = re.compile(r"\b((?:scalable_topic|segment_broker)_[a-z0-9_]+)")
GROUPING = re.compile(r"\bby \(([^)]*)\)")
SCRAPE_LABELS = {"pod", "instance", "job", "le"}
"""Added by Prometheus (Kubernetes service discovery) or by histogram buckets."""
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


class _NoReporter:
    async def write(self, namespace: str, topic: str, segment_id: int, rates: object) -> None:
        return None


def _family_names(registry: CollectorRegistry) -> dict[str, str]:
    """Every sample name a registry can produce → its family name."""
    names: dict[str, str] = {}
    for family in registry.collect():
        for suffix in ("", *SUFFIXES.get(family.type, ())):
            names[family.name + suffix] = family.name
    return names


def _declared(objects: Any) -> dict[str, set[str]]:
    """Family name → label names of the metric objects (prometheus-client) among ``objects``."""
    found: dict[str, set[str]] = {}
    for metric in objects:
        name, labels = getattr(metric, "_name", None), getattr(metric, "_labelnames", None)
        if isinstance(name, str) and labels is not None:
            found[name] = set(labels)
    return found


def exported() -> tuple[dict[str, str], dict[str, set[str]]]:
    broker = broker_metrics.BrokerMetrics()
    broker.watch_segments(list)
    # The load tracker's families (segment_broker/load.py), in the registry it is given.
    load_registry = CollectorRegistry()
    tracker = LoadTracker(ThresholdReporter(_NoReporter()), None, registry=load_registry)
    names = _family_names(REGISTRY) | _family_names(broker.registry) | _family_names(load_registry)
    labels = (
        _declared(vars(operator_metrics).values())
        | _declared(vars(broker).values())
        | _declared([*tracker._gauges, tracker._samples])
    )
    for collected in operator_metrics.KEY_SHARED.describe():
        labels[collected.name] = set(operator_metrics.KEY_SHARED.LABELS)
    per_segment = set(broker_metrics._SEG_LABELS)
    for family in set(names.values()):
        if family.startswith("segment_broker_") and family not in labels:
            # The per-segment families of the broker's collector.
            labels[family] = per_segment | (
                {"subscription"} if family == "segment_broker_backlog_entries" else set()
            )
    return names, labels


def test_every_dashboard_query_names_an_exported_metric_and_its_labels() -> None:
    names, labels = exported()
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert panels
    for panel in panels:
        for target in panel["targets"]:
            expr = target["expr"]
            used = METRIC.findall(expr)
            assert used, (panel["title"], expr)
            for name in used:
                assert name in names, f"{panel['title']}: {name} is not exported"
                have = labels.get(names[name], set()) | SCRAPE_LABELS
                for group in GROUPING.findall(expr):
                    wanted = {g.strip() for g in group.split(",") if g.strip()}
                    assert wanted <= have, (panel["title"], name, sorted(wanted - have))


def test_the_check_rejects_an_unknown_metric_and_label() -> None:
    names, labels = exported()
    assert "segment_broker_no_such_metric_total" not in names
    assert "segment_broker_produced_messages_total" in names
    assert "segment_broker_load_samples_total" in names and "segment_broker_msg_rate_in" in names
    assert "subscription" not in labels["scalable_topic_active_segments"]


def _metric_variables() -> dict[str, str]:
    """Family name → the variable (operator module) or attribute (``BrokerMetrics``) holding
    the prometheus-client object. Families missing here are the broker's per-segment
    collector's, computed from the hosted segments at every scrape."""
    found: dict[str, str] = {}
    for variables in (vars(operator_metrics), vars(broker_metrics.BrokerMetrics())):
        for variable, metric in variables.items():
            name = getattr(metric, "_name", None)
            if isinstance(name, str) and getattr(metric, "_labelnames", None) is not None:
                found[name] = variable
    return found


def _read_names(root: Path) -> set[str]:
    """Names and attributes read (not assigned) anywhere in the non-test code under ``root``."""
    read: set[str] = set()
    for path in root.rglob("*.py"):
        if path.name == "testing.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                read.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                read.add(node.attr)
    return read


def test_every_metric_the_dashboard_queries_is_produced_by_code() -> None:
    """Each metric object a query names is used beyond its declaration (its value is set,
    counted or observed, or it is handed to code that does). The values themselves are checked
    by the integration tests (e.g. test_operator_lifecycle.py: the per-topic gauges after a
    split and after deletion)."""
    variables = _metric_variables()
    read = set().union(*(_read_names(root) for root in SOURCES))
    names, _ = exported()
    panels = json.loads(DASHBOARD.read_text())["panels"]
    queried = {names[m] for p in panels for t in p["targets"] for m in METRIC.findall(t["expr"])}
    queried |= {
        names[m]
        for v in json.loads(DASHBOARD.read_text())["templating"]["list"]
        for m in METRIC.findall(str(v.get("query", "")))
    }
    assert "scalable_topic_active_segments" in queried
    unused = sorted(f for f in queried if f in variables and variables[f] not in read)
    assert not unused, f"declared but never set: {unused}"


def test_every_metric_the_docs_name_is_exported() -> None:
    names, _ = exported()
    for doc in sorted((REPO / "docs").glob("*.md")):
        for name in METRIC.findall(doc.read_text()):
            assert name in names, f"{doc.name}: {name} is not exported"

"""The Grafana dashboard (docs/dashboards/scalable-topics.json) queries only metrics the
operator and the brokers export, grouped by labels they carry."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

import scalable_topics.controller.metrics as operator_metrics
from segment_broker import metrics as broker_metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "dashboards" / "scalable-topics.json"
METRIC = re.compile(r"\b((?:scalable_topic|segment_broker)_[a-z0-9_]+)")
GROUPING = re.compile(r"\bby \(([^)]*)\)")
SCRAPE_LABELS = {"pod", "instance", "job", "le"}
"""Added by Prometheus (Kubernetes service discovery) or by histogram buckets."""
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


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
    names = _family_names(REGISTRY) | _family_names(broker.registry)
    labels = _declared(vars(operator_metrics).values()) | _declared(vars(broker).values())
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
    assert "segment_broker_msg_rate_in" not in names
    assert "segment_broker_produced_messages_total" in names
    assert "subscription" not in labels["scalable_topic_active_segments"]

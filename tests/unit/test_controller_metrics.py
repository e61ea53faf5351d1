"""Values of the operator's per-topic series: what the leader's observation of a layout sets,
what forgetting a topic removes, and the operations in progress read from the leader's cache;
and the broker's counters that exist before their first event."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY

from scalable_topics.controller import metrics
from scalable_topics.controller.app import LedOperations
from scalable_topics.controller.cache import TopicCache
from scalable_topics.core.jsontypes import JsonObj
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.resources import format_time
from segment_broker.metrics import BrokerMetrics

NS, TOPIC = "metrics-ns", "metrics-topic"
LABELS = {"namespace": NS, "topic": TOPIC}
PER_TOPIC = (
    "scalable_topic_active_segments",
    "scalable_topic_layout_epoch",
    "scalable_topic_auto_splits_total",
    "scalable_topic_auto_merges_total",
    "scalable_topic_auto_rebuckets_total",
    "scalable_topic_pruned_segments_total",
    "scalable_topic_observed_drains_total",
)


def _value(name: str, labels: dict[str, str] = LABELS) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_observing_a_layout_sets_the_gauges_and_starts_the_counters_at_zero() -> None:
    layout = SegmentLayout.initial(3).split(0)
    metrics.observe_layout(NS, TOPIC, layout)
    try:
        assert _value("scalable_topic_active_segments") == 4
        assert _value("scalable_topic_layout_epoch") == 1
        for name in PER_TOPIC[2:]:
            assert _value(name) == 0.0, name
        metrics.AUTO_SPLITS.labels(NS, TOPIC).inc()
        metrics.observe_layout(NS, TOPIC, layout)
        assert _value("scalable_topic_auto_splits_total") == 1.0, "observing again keeps counts"
        metrics.OPERATIONS.labels(NS, TOPIC, "split", "auto", "committed").inc()
        metrics.OPERATIONS.labels(NS, "other", "split", "auto", "committed").inc()
        metrics.AUTOSCALE_SUPPRESSED.labels(NS, TOPIC, "disabled").inc()
    finally:
        metrics.forget_topic(NS, TOPIC)
    for name in PER_TOPIC:
        assert _value(name) is None, f"{name} left behind"
    ops = {"kind": "split", "source": "auto", "outcome": "committed"}
    assert _value("scalable_topic_operations_total", {**LABELS, **ops}) is None
    assert (
        _value("scalable_topic_autoscale_suppressed_total", {**LABELS, "reason": "disabled"})
        is None
    )
    other = {"namespace": NS, "topic": "other", **ops}
    assert _value("scalable_topic_operations_total", other) == 1.0, "another topic's series stays"
    metrics.forget_topic(NS, "other")


def _topic(name: str, operation: dict[str, str]) -> JsonObj:
    return {"metadata": {"namespace": NS, "name": name}, "status": {"operation": operation}}


def test_operations_in_progress_come_from_the_led_topics_in_the_cache_at_each_scrape() -> None:
    name = "scalable_topic_operation_started_timestamp_seconds"
    labels = {**LABELS, "kind": "split", "phase": "ChildrenCreated"}
    op = {"kind": "split", "phase": "ChildrenCreated", "startedAt": format_time(1700000000.0)}
    cache = TopicCache(controller_url=lambda namespace, topic: "")
    cache.put_topic(_topic(TOPIC, op))
    cache.put_topic(_topic("unreadable", {**op, "startedAt": "yesterday"}))
    cache.put_topic(_topic("idle", {}))
    led = {TOPIC, "unreadable", "idle"}
    source = LedOperations(cache, lambda namespace, topic: topic in led)
    assert _value(name, labels) == 1700000000.0
    series = [
        s.labels["topic"]
        for family in REGISTRY.collect()
        if family.name == name
        for s in family.samples
        if s.labels["namespace"] == NS
    ]
    assert series == [TOPIC], "only the readable operation has a series"
    led.clear()
    assert _value(name, labels) is None, "a topic no longer led loses its series"
    led.add(TOPIC)
    cache.put_topic(_topic(TOPIC, {}))
    assert _value(name, labels) is None, "a finished operation loses its series"
    cache.put_topic(_topic(TOPIC, op))
    assert _value(name, labels) == 1700000000.0
    del source
    assert _value(name, labels) is None, "a replica gone takes its series with it"


def test_fenced_handshake_outcomes_exist_before_the_first_one() -> None:
    registry = BrokerMetrics().registry
    for outcome in ("opened", "refused"):
        value = registry.get_sample_value(
            "segment_broker_fenced_handshakes_total", {"outcome": outcome}
        )
        assert value == 0.0, outcome


def test_forgetting_a_lost_shards_topics_collects_each_family_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lost shard's topics are forgotten in one pass per family: forgetting 10,000 topics one
    by one collected every child of every family per topic (quadratic; it blocked the event
    loop for minutes and the liveness probe killed the replica)."""
    lost = [(NS, f"lost-{i}") for i in range(200)]
    kept = (NS, "kept")
    for namespace, name in [*lost, kept]:
        metrics.observe_layout(namespace, name, SegmentLayout.initial(2))
        metrics.AUTOSCALE_EVALUATIONS.labels(namespace, name, "Idle").inc()
        metrics.OPERATIONS.labels(namespace, name, "split", "auto", "committed").inc()
    collects = 0
    real = metrics.AUTOSCALE_EVALUATIONS.collect

    def counted() -> Any:
        nonlocal collects
        collects += 1
        return real()

    monkeypatch.setattr(metrics.AUTOSCALE_EVALUATIONS, "collect", counted)
    try:
        metrics.forget_topics(lost)
        assert collects == 1
        for namespace, name in lost:
            labels = {"namespace": namespace, "topic": name}
            assert _value("scalable_topic_active_segments", labels) is None
            assert (
                _value("scalable_topic_autoscale_evaluations_total", {**labels, "result": "Idle"})
                is None
            )
        kept_labels = {"namespace": kept[0], "topic": kept[1]}
        assert _value("scalable_topic_active_segments", kept_labels) == 2
        assert (
            _value("scalable_topic_autoscale_evaluations_total", {**kept_labels, "result": "Idle"})
            == 1.0
        )
    finally:
        monkeypatch.undo()
        metrics.forget_topics([*lost, kept])

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


def test_forgetting_a_topic_touches_its_own_series_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Forgetting a topic (deleted, or its shard lost) removes its series and touches no other
    topic's: found by collecting every child of every family per topic, forgetting 10,000 topics
    one by one was quadratic (a lost shard blocked the event loop for minutes and the liveness
    probe killed the replica; deletes one by one paid it too)."""
    topics = [(NS, f"many-{i}") for i in range(200)]
    for namespace, name in topics:
        metrics.observe_layout(namespace, name, SegmentLayout.initial(2))
        metrics.AUTOSCALE_EVALUATIONS.labels(namespace, name, "Idle").inc()
        metrics.AUTOSCALE_EVALUATIONS.labels(namespace=namespace, topic=name, result="Acted").inc()
        metrics.OPERATIONS.labels(namespace, name, "split", "auto", "committed").inc()
    collects = 0
    removed: list[tuple[str, ...]] = []
    real_collect = metrics.AUTOSCALE_EVALUATIONS.collect
    real_remove = metrics.AUTOSCALE_EVALUATIONS.remove

    def counted_collect() -> Any:
        nonlocal collects
        collects += 1
        return real_collect()

    def counted_remove(*values: str) -> None:
        removed.append(values)
        real_remove(*values)

    monkeypatch.setattr(metrics.AUTOSCALE_EVALUATIONS, "collect", counted_collect)
    monkeypatch.setattr(metrics.AUTOSCALE_EVALUATIONS, "remove", counted_remove)
    gone, lost, kept = topics[0], topics[1:150], topics[150:]
    try:
        metrics.forget_topic(*gone)
        assert sorted(removed) == [(*gone, "Acted"), (*gone, "Idle")]
        metrics.forget_topics(lost)
        assert len(removed) == 2 * (1 + len(lost))
        assert collects == 0
        for namespace, name in [gone, *lost]:
            labels = {"namespace": namespace, "topic": name}
            assert _value("scalable_topic_active_segments", labels) is None
            for result in ("Idle", "Acted"):
                evaluations = {**labels, "result": result}
                assert _value("scalable_topic_autoscale_evaluations_total", evaluations) is None
            operations = {**labels, "kind": "split", "source": "auto", "outcome": "committed"}
            assert _value("scalable_topic_operations_total", operations) is None
        for namespace, name in kept:
            labels = {"namespace": namespace, "topic": name}
            assert _value("scalable_topic_active_segments", labels) == 2
            assert (
                _value("scalable_topic_autoscale_evaluations_total", {**labels, "result": "Idle"})
                == 1.0
            )
        metrics.AUTOSCALE_EVALUATIONS.labels(*gone, "Idle").inc()
        assert (
            _value(
                "scalable_topic_autoscale_evaluations_total",
                {"namespace": gone[0], "topic": gone[1], "result": "Idle"},
            )
            == 1.0
        ), "a topic forgotten and then counted again has a series again"
    finally:
        monkeypatch.undo()
        metrics.forget_topics(topics)

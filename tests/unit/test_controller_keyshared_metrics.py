"""PIP-486 per-segment metrics of the consumer hub (issue 14): bucket count, consumers sharing a
segment, buckets withheld for a hand-off, drain-wide, reassignments - read at each scrape from
the real hub's coordinators."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from scalable_topics.controller.consumers import ConsumerHub
from scalable_topics.core.assignment import SubscriptionCoordinator
from scalable_topics.core.layout import SegmentLayout
from tests.memory_dags import MemoryDagSource

NS, TOPIC, SUB = "metrics", "keyed", "billing"
NAMES = (
    "scalable_topic_segment_buckets",
    "scalable_topic_segment_consumers",
    "scalable_topic_buckets_withheld",
    "scalable_topic_segment_drain_wide",
    "scalable_topic_bucket_reassignments_total",
)


def scrape() -> dict[str, dict[int, float]]:
    """Metric name -> segment -> value, for this test's topic and subscription."""
    found: dict[str, dict[int, float]] = {name: {} for name in NAMES}
    for family in REGISTRY.collect():
        for sample in family.samples:
            labels = sample.labels
            if sample.name in found and labels.get("topic") == TOPIC:
                assert labels["namespace"] == NS and labels["subscription"] == SUB
                found[sample.name][int(labels["segment"])] = sample.value
    return found


async def _persist(*_: Any) -> None:
    return None


async def test_the_hub_exports_key_shared_state_per_segment() -> None:
    dags = MemoryDagSource()
    layout = SegmentLayout.initial(1)
    dags.publish_layout(NS, TOPIC, layout, bucket_budget=4)
    hub = ConsumerHub(persist=_persist, on_consumers_changed=lambda ns, t: None, dags=dags)
    hub.restore(NS, TOPIC, layout, [], grace_period=30.0, strategies={SUB: "sticky"})
    coordinator = hub.coordinator(NS, TOPIC, SUB)
    assert isinstance(coordinator, SubscriptionCoordinator)
    assert scrape() == {name: {} for name in NAMES}, "no consumer: nothing read"

    coordinator.register("a", 0.0)
    assert scrape() == {
        "scalable_topic_segment_buckets": {0: 4},
        "scalable_topic_segment_consumers": {0: 1},
        "scalable_topic_buckets_withheld": {0: 0},
        "scalable_topic_segment_drain_wide": {0: 0},
        "scalable_topic_bucket_reassignments_total": {0: 0},
    }
    coordinator.register("b", 1.0)  # b takes two buckets, withheld until a released them
    values = scrape()
    assert values["scalable_topic_segment_consumers"] == {0: 2}
    assert values["scalable_topic_buckets_withheld"] == {0: 2}
    assert values["scalable_topic_bucket_reassignments_total"] == {0: 2}
    coordinator.released("a", 0, [2, 3], 2.0)
    assert scrape()["scalable_topic_buckets_withheld"] == {0: 0}

    split = layout.split(0)
    dags.publish_layout(NS, TOPIC, split, bucket_budget=4)
    hub.layout_changed(NS, TOPIC, split)
    values = scrape()
    assert values["scalable_topic_segment_drain_wide"] == {0: 1}, "sealed 0 read by a and b"
    assert values["scalable_topic_segment_buckets"] == {0: 4}
    coordinator.drained(None, 0, 3.0)
    values = scrape()
    assert set(values["scalable_topic_segment_buckets"]) == {1, 2}, "children, N = 2 each"
    assert values["scalable_topic_segment_drain_wide"] == {1: 0, 2: 0}
    hub.forget_topic(NS, TOPIC)
    assert scrape() == {name: {} for name in NAMES}

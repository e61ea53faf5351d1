"""Reading topic objects, and when a recommendation needs writing (pure parts of the driver)."""

from __future__ import annotations

from typing import Any

from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.policy import ClusterDefaults
from scalable_topics.core.resources import format_time
from scalable_topics.recommender.history import window_partitions
from scalable_topics.recommender.topics import segment_buckets, stream_consumers, topic_state
from scalable_topics.recommender.writer import compact, needs_write, same_recommendation

NOW = 1_795_392_000.0


def topic(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "scalabletopics.io/v1alpha1",
        "kind": "ScalableTopic",
        "metadata": {"namespace": "prod", "name": "orders", "generation": 3},
        "spec": {
            "initialSegments": 4,
            "autoScale": {"maxSegments": 16, "mergeMsgRateInThreshold": 200},
            "subscriptions": [
                {"name": "billing", "type": "Stream"},
                {"name": "q", "type": "Queue"},
            ],
        },
        "status": status,
    }


def test_topic_state_reads_layout_policy_and_consumers() -> None:
    layout = SegmentLayout.initial(4).split(2)
    state = topic_state(
        topic(
            layout=layout.to_metadata(),
            subscriptions=[
                {"name": "billing", "consumers": [{"name": f"c{i}"} for i in range(6)]},
                {"name": "q", "consumers": [{"name": "w"}] * 9},
                {"name": "audit", "type": "Stream", "consumers": []},
            ],
        )
    )
    assert state.problem is None and state.layout == layout
    assert state.policy.max_segments == 16 and state.policy.merge_msg_rate_in_threshold == 200
    assert state.stream_consumers == {"billing": 6, "audit": 0}
    assert state.generation == 3


def test_topic_state_problems() -> None:
    assert topic_state(topic()).problem == "no status.layout yet"
    broken = topic(layout={"epoch": 1, "nextSegmentId": 1, "segments": {}})
    assert "invalid status.layout" in str(topic_state(broken).problem)
    bad_spec = topic(layout=SegmentLayout.initial(1).to_metadata())
    bad_spec["spec"]["autoScale"] = {"maxSegments": 1, "minSegments": 5}
    assert "invalid spec" in str(topic_state(bad_spec).problem)


def test_topic_state_resolves_the_namespace_annotation_and_the_cluster_level() -> None:
    """The controller's resolution: topic, namespace annotation, cluster ConfigMap, defaults."""
    layout = SegmentLayout.initial(4).to_metadata()
    cluster = ClusterDefaults(knobs={"split_msg_rate_in_threshold": 20_000.0, "max_dag_depth": 3})
    state = topic_state(
        topic(layout=layout),
        namespace_policy='{"splitMsgRateInThreshold": 50000, "maxSegments": 4}',
        cluster=cluster,
    )
    assert state.problem is None and state.notes == ()
    assert state.policy.split_msg_rate_in_threshold == 50_000, "namespace over cluster"
    assert state.policy.max_segments == 16, "topic over namespace"
    assert state.policy.max_dag_depth == 3, "cluster over the built-in default"
    ignored = topic_state(topic(layout=layout), namespace_policy='{"maxSegmentz": 4}')
    assert ignored.problem is None and ignored.policy.max_segments == 16
    (note,) = ignored.notes
    assert "annotation is ignored" in note and "maxSegmentz" in note


def test_stream_consumers_without_status() -> None:
    assert stream_consumers({"spec": {}}) == {}


def test_segment_buckets() -> None:
    segments = [
        {
            "metadata": {"namespace": "prod"},
            "spec": {"topic": "orders", "segmentId": 0, "buckets": 2},
        },
        {
            "metadata": {"namespace": "prod", "labels": {"scalabletopics.io/topic": "orders"}},
            "spec": {"segmentId": 1},
        },
        {
            "metadata": {"namespace": "dev"},
            "spec": {"topic": "orders", "segmentId": 0, "buckets": 8},
        },
        {"metadata": {"namespace": "dev"}, "spec": {"segmentId": 3}},
    ]
    assert segment_buckets(segments) == {
        ("prod", "orders"): {0: 2, 1: 1},
        ("dev", "orders"): {0: 8},
    }


def _rec(computed_at: float, actions: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "computedAt": format_time(computed_at),
        "window": "1h",
        "basedOnEpoch": 2,
        "recommendedSegments": 4,
        "actions": actions,
    }


def test_compact_drops_nulls_recursively() -> None:
    assert compact({"a": None, "b": [{"c": None, "d": 1}], "e": {"f": None}}) == {
        "b": [{"d": 1}],
        "e": {},
    }


def test_unchanged_recommendations_are_not_rewritten() -> None:
    split = [{"kind": "split", "segments": [1], "at": None, "reason": "msg-rate-in"}]
    old_empty = _rec(NOW - 3000, [])
    assert same_recommendation(old_empty, _rec(NOW, []))
    assert not needs_write(old_empty, _rec(NOW, []), now=NOW, refresh_after=300)
    assert needs_write(None, _rec(NOW, []), now=NOW, refresh_after=300)
    assert needs_write(old_empty, _rec(NOW, split), now=NOW, refresh_after=300)
    # Same actions: rewritten only to keep computedAt fresh for the controller.
    recent = compact(_rec(NOW - 120, split))
    assert not needs_write(recent, _rec(NOW, split), now=NOW, refresh_after=300)
    old = compact(_rec(NOW - 600, split))
    assert needs_write(old, _rec(NOW, split), now=NOW, refresh_after=300)
    assert needs_write(
        {**recent, "computedAt": "garbage"}, _rec(NOW, split), now=NOW, refresh_after=300
    )


def test_window_partitions_cover_the_hours_the_window_touches() -> None:
    # NOW is 2026-11-23T00:00:00Z.
    assert window_partitions(NOW - 3600, NOW) == [
        "dt=2026-11-22/hour=23",
        "dt=2026-11-23/hour=00",
    ]
    assert window_partitions(NOW - 1800, NOW - 60) == ["dt=2026-11-22/hour=23"]
    assert len(window_partitions(NOW - 86400, NOW)) == 25

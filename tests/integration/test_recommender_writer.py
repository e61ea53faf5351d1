"""The recommender's status writes against the embedded API server: CAS, retry, no-op, 404."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.resources import format_time
from scalable_topics.localcluster.cluster import LocalCluster
from scalable_topics.recommender.writer import TopicStore, WriteOutcome, WriteResult

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NOW = 1_795_392_000.0
NS = "default"


def recommendation(computed_at: float, *, epoch: int = 0, segment: int = 1) -> dict[str, Any]:
    return {
        "computedAt": format_time(computed_at),
        "window": "1h",
        "basedOnEpoch": epoch,
        "recommendedSegments": 5,
        "actions": [
            {
                "kind": "split",
                "segments": [segment],
                "at": 0x47FF,
                "buckets": None,
                "reason": "msg-rate-in",
                "detail": "segment 4000-7fff-1 msgRateIn 15000/s is 1.5x the split threshold",
                "stats": {"mean": {"msgRateIn": 15000.0}},
            }
        ],
    }


def replace_status(store: TopicStore, name: str, obj: dict[str, Any]) -> dict[str, Any]:
    """A status write past the recommender's writer (set-up, or the leader's own writes)."""
    result: dict[str, Any] = store.custom.replace_namespaced_custom_object_status(
        "scalabletopics.io", "v1alpha1", NS, "scalabletopics", name, obj
    )
    return result


async def make_topic(cluster: LocalCluster, store: TopicStore, name: str) -> dict[str, Any]:
    await cluster.apply_file(REPO / "crds")
    cluster.create(
        {
            "apiVersion": "scalabletopics.io/v1alpha1",
            "kind": "ScalableTopic",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"initialSegments": 4},
        }
    )

    def set_layout() -> dict[str, Any]:
        obj = store.get_topic(NS, name)
        assert obj is not None
        obj["status"] = {"layout": SegmentLayout.initial(4).to_metadata(), "epoch": 0}
        return replace_status(store, name, obj)

    return await asyncio.to_thread(set_layout)


async def read_topic(store: TopicStore, name: str = "orders") -> dict[str, Any]:
    obj = await asyncio.to_thread(store.get_topic, NS, name)
    assert obj is not None
    return obj


async def write(
    store: TopicStore,
    at: float = NOW,
    *,
    name: str = "orders",
    after_read: Callable[[dict[str, Any]], None] | None = None,
) -> WriteOutcome:
    """``recommendation(at)`` written at ``at`` with a 300 s refresh."""
    return await asyncio.to_thread(
        store.write_recommendation,
        NS,
        name,
        recommendation(at),
        now=at,
        refresh_after=300,
        after_read=after_read,
    )


@pytest.fixture
async def store(local_cluster: LocalCluster) -> Any:
    store = await asyncio.to_thread(TopicStore.connect, str(local_cluster.kubeconfig))
    yield store
    store.close()


async def test_write_then_unchanged_is_not_rewritten(
    local_cluster: LocalCluster, store: TopicStore
) -> None:
    before = await make_topic(local_cluster, store, "orders")
    outcome = await write(store)
    assert outcome.result is WriteResult.WRITTEN and outcome.conflicts == 0
    obj = await read_topic(store)
    rec = obj["status"]["recommendation"]
    assert rec["actions"][0]["at"] == 0x47FF and rec["basedOnEpoch"] == 0
    assert "buckets" not in rec["actions"][0]  # nulls are not sent
    assert rec["actions"][0]["stats"] == {"mean": {"msgRateIn": 15000.0}}
    assert obj["status"]["layout"] == before["status"]["layout"]
    version = obj["metadata"]["resourceVersion"]

    # The same recommendation two minutes later: nothing is written.
    again = await write(store, NOW + 120)
    assert again.result is WriteResult.UNCHANGED and again.resource_version == version
    obj = await read_topic(store)
    assert obj["metadata"]["resourceVersion"] == version

    # Past refresh_after a standing recommendation is rewritten to stay fresh.
    later = await write(store, NOW + 600)
    assert later.result is WriteResult.WRITTEN and later.resource_version != version


async def test_concurrent_status_change_causes_409_and_a_retry(
    local_cluster: LocalCluster, store: TopicStore
) -> None:
    await make_topic(local_cluster, store, "orders")
    other = TopicStore.connect(str(local_cluster.kubeconfig))
    reads: list[str] = []

    def concurrent_change(obj: dict[str, Any]) -> None:
        reads.append(obj["metadata"]["resourceVersion"])
        if len(reads) > 1:
            return
        # Another writer (the leader) changes the status between our read and our write.
        fresh = other.get_topic(NS, "orders")
        assert fresh is not None
        fresh["status"]["activeSegments"] = 4
        replace_status(other, "orders", fresh)

    try:
        outcome = await write(store, after_read=concurrent_change)
    finally:
        other.close()
    assert outcome.result is WriteResult.WRITTEN and outcome.conflicts == 1
    assert len(reads) == 2 and reads[0] != reads[1]
    obj = await read_topic(store)
    # Both writes survive: the CAS never overwrote the concurrent change.
    assert obj["status"]["activeSegments"] == 4
    assert obj["status"]["recommendation"]["actions"][0]["segments"] == [1]


async def test_layout_change_between_read_and_write_makes_it_stale(
    local_cluster: LocalCluster, store: TopicStore
) -> None:
    await make_topic(local_cluster, store, "orders")

    def split_meanwhile(obj: dict[str, Any]) -> None:
        fresh = store.get_topic(NS, "orders")
        assert fresh is not None
        if fresh["status"]["layout"]["epoch"] != 0:
            return
        fresh["status"]["layout"] = SegmentLayout.initial(4).split(1).to_metadata()
        replace_status(store, "orders", fresh)

    outcome = await write(store, after_read=split_meanwhile)
    assert outcome.result is WriteResult.STALE and outcome.conflicts == 1
    obj = await read_topic(store)
    assert "recommendation" not in obj["status"]


async def test_vanished_topics_are_skipped(local_cluster: LocalCluster, store: TopicStore) -> None:
    await make_topic(local_cluster, store, "orders")
    missing = await write(store, name="nope")
    assert missing.result is WriteResult.VANISHED

    def delete_meanwhile(obj: dict[str, Any]) -> None:
        store.custom.delete_namespaced_custom_object(
            "scalabletopics.io", "v1alpha1", NS, "scalabletopics", "orders"
        )

    deleted = await write(store, after_read=delete_meanwhile)
    assert deleted.result is WriteResult.VANISHED

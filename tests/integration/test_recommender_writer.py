"""The recommender's status writes against the real API server (a namespace of the session's
control plane): CAS, retry, no-op, 404."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.resources import format_time
from scalable_topics.recommender.writer import TopicStore, WriteOutcome, WriteResult

from .conftest import ClusterNamespace

pytestmark = pytest.mark.integration

NOW = 1_795_392_000.0


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


def replace_status(store: Store, name: str, obj: dict[str, Any]) -> dict[str, Any]:
    """A status write past the recommender's writer (set-up, or the leader's own writes)."""
    result: dict[str, Any] = store.topics.custom.replace_namespaced_custom_object_status(
        "scalabletopics.io", "v1alpha1", store.namespace, "scalabletopics", name, obj
    )
    return result


@dataclass
class Store:
    """The recommender's writer, connected as the cluster's admin, and the test's namespace."""

    topics: TopicStore
    namespace: str

    def get_topic(self, name: str) -> dict[str, Any] | None:
        return self.topics.get_topic(self.namespace, name)


async def make_topic(cluster: ClusterNamespace, store: Store, name: str) -> dict[str, Any]:
    await cluster.apply_crds()
    topic = {
        "apiVersion": "scalabletopics.io/v1alpha1",
        "kind": "ScalableTopic",
        "metadata": {"name": name},
        "spec": {"initialSegments": 4},
    }
    await cluster.kubectl("create", "-f", "-", input=json.dumps(topic))

    def set_layout() -> dict[str, Any]:
        obj = store.get_topic(name)
        assert obj is not None
        obj["status"] = {"layout": SegmentLayout.initial(4).to_metadata(), "epoch": 0}
        return replace_status(store, name, obj)

    return await asyncio.to_thread(set_layout)


async def read_topic(store: Store, name: str = "orders") -> dict[str, Any]:
    obj = await asyncio.to_thread(store.get_topic, name)
    assert obj is not None
    return obj


async def write(
    store: Store,
    at: float = NOW,
    *,
    name: str = "orders",
    after_read: Callable[[dict[str, Any]], None] | None = None,
) -> WriteOutcome:
    """``recommendation(at)`` written at ``at`` with a 300 s refresh."""
    return await asyncio.to_thread(
        store.topics.write_recommendation,
        store.namespace,
        name,
        recommendation(at),
        now=at,
        refresh_after=300,
        after_read=after_read,
    )


@pytest.fixture
def store(local_cluster: ClusterNamespace) -> Iterator[Store]:
    topics = TopicStore.connect(str(local_cluster.kubeconfig))
    yield Store(topics, local_cluster.namespace)
    topics.close()


async def test_write_then_unchanged_is_not_rewritten(
    local_cluster: ClusterNamespace, store: Store
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
    local_cluster: ClusterNamespace, store: Store
) -> None:
    await make_topic(local_cluster, store, "orders")
    other = Store(TopicStore.connect(str(local_cluster.kubeconfig)), store.namespace)
    reads: list[str] = []

    def concurrent_change(obj: dict[str, Any]) -> None:
        reads.append(obj["metadata"]["resourceVersion"])
        if len(reads) > 1:
            return
        # Another writer (the leader) changes the status between our read and our write.
        fresh = other.get_topic("orders")
        assert fresh is not None
        fresh["status"]["activeSegments"] = 4
        replace_status(other, "orders", fresh)

    try:
        outcome = await write(store, after_read=concurrent_change)
    finally:
        other.topics.close()
    assert outcome.result is WriteResult.WRITTEN and outcome.conflicts == 1
    assert len(reads) == 2 and reads[0] != reads[1]
    obj = await read_topic(store)
    # Both writes survive: the CAS never overwrote the concurrent change.
    assert obj["status"]["activeSegments"] == 4
    assert obj["status"]["recommendation"]["actions"][0]["segments"] == [1]


async def test_layout_change_between_read_and_write_makes_it_stale(
    local_cluster: ClusterNamespace, store: Store
) -> None:
    await make_topic(local_cluster, store, "orders")

    def split_meanwhile(obj: dict[str, Any]) -> None:
        fresh = store.get_topic("orders")
        assert fresh is not None
        if fresh["status"]["layout"]["epoch"] != 0:
            return
        fresh["status"]["layout"] = SegmentLayout.initial(4).split(1).to_metadata()
        replace_status(store, "orders", fresh)

    outcome = await write(store, after_read=split_meanwhile)
    assert outcome.result is WriteResult.STALE and outcome.conflicts == 1
    obj = await read_topic(store)
    assert "recommendation" not in obj["status"]


async def test_vanished_topics_are_skipped(local_cluster: ClusterNamespace, store: Store) -> None:
    await make_topic(local_cluster, store, "orders")
    missing = await write(store, name="nope")
    assert missing.result is WriteResult.VANISHED

    def delete_meanwhile(obj: dict[str, Any]) -> None:
        store.topics.custom.delete_namespaced_custom_object(
            "scalabletopics.io", "v1alpha1", store.namespace, "scalabletopics", "orders"
        )

    deleted = await write(store, after_read=delete_meanwhile)
    assert deleted.result is WriteResult.VANISHED

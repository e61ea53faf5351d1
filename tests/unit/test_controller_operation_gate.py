"""A split or merge does not start while one of its parents moves to another broker
(``OperationExecutor.start``; a move, in turn, refuses to start while an operation is in flight):
a seal and a copy of the same log must not interleave (docs/operator.md, "Moving a segment")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client as k8s

from scalable_topics.controller.brokers import BrokerAdmin
from scalable_topics.controller.cache import TopicCache
from scalable_topics.controller.kube import KubeApi
from scalable_topics.controller.protocol import (
    OperationExecutor,
    OperationRejected,
)
from scalable_topics.core.jsontypes import JsonObj
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.operation import plan_merge, plan_split
from scalable_topics.core.resources import segment_manifest

NAMESPACE = "gate"
TOPIC: JsonObj = {
    "apiVersion": "scalabletopics.io/v1alpha1",
    "kind": "ScalableTopic",
    "metadata": {"namespace": NAMESPACE, "name": "orders", "uid": "topic-uid"},
    "spec": {"initialSegments": 2},
}
MOVING = {
    "id": "move-1",
    "phase": "Releasing",
    "source": {"pod": "broker-0", "url": "http://127.0.0.1:1"},
    "destination": {"pod": "broker-1", "url": "http://127.0.0.1:2"},
}


_clients: list[k8s.ApiClient] = []


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    while _clients:
        await _clients.pop().close()


def executor_with(moving: set[int]) -> tuple[OperationExecutor, SegmentLayout]:
    """An executor over a cache holding the two Segments of a fresh 2-segment topic, those in
    ``moving`` with a transfer record. Its API client has no server: anything past the gate
    fails to connect."""
    layout = SegmentLayout.initial(2)
    cache = TopicCache(controller_url=lambda namespace, name: "http://controller")
    for sid, info in layout.segments.items():
        meta = TOPIC["metadata"]
        body = segment_manifest(
            topic=meta["name"],
            namespace=meta["namespace"],
            topic_uid=meta["uid"],
            segment_id=sid,
            hash_range=info.hash_range,
        )
        body["metadata"]["uid"] = f"segment-{sid}"
        status: dict[str, Any] = {"state": "Active"}
        if sid in moving:
            status["transfer"] = MOVING
        body["status"] = status
        cache.put_segment(body)

    async def events(topic: JsonObj, type_: str, reason: str, message: str) -> None:
        raise AssertionError(f"no event expected, got {reason}: {message}")

    _clients.append(k8s.ApiClient(k8s.Configuration(host="http://127.0.0.1:9")))
    kube = KubeApi(_clients[-1])
    return OperationExecutor(kube, BrokerAdmin(), cache, events=events), layout


async def test_a_split_of_a_moving_segment_is_rejected_before_anything_is_written() -> None:
    executor, layout = executor_with({0})
    with pytest.raises(OperationRejected, match=r"segment\(s\) \[0\] are moving"):
        await executor.start(TOPIC, plan_split("split-1", layout, 0, parent_buckets=1))


async def test_a_merge_waits_for_either_parent_to_stop_moving() -> None:
    executor, layout = executor_with({1})
    with pytest.raises(OperationRejected, match=r"segment\(s\) \[1\] are moving.*merge"):
        await executor.start(
            TOPIC, plan_merge("merge-1", layout, [0, 1], parent_buckets={0: 1, 1: 1})
        )


async def test_a_move_of_another_segment_does_not_hold_an_operation_back() -> None:
    executor, layout = executor_with({1})
    topic = {**TOPIC, "status": {"layout": layout.to_metadata()}}
    # Past the gate, the intent is written to the API server: there is none here.
    with pytest.raises(aiohttp.ClientError):
        await executor.start(topic, plan_split("split-2", layout, 0, parent_buckets=1))

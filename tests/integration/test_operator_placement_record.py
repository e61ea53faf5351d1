"""A new Segment's placement is recorded with its zero load as a compare-and-swap, against the
real API server: a load its broker wrote after the operator's copy was taken is kept, the
placement is recorded on the Segment as it is then, and the cache holds what the API server
answered (``OperationExecutor._record_placement``)."""

from __future__ import annotations

from typing import Any

import pytest

from scalable_topics.controller.brokers import BrokerAdmin
from scalable_topics.controller.cache import TopicCache
from scalable_topics.controller.protocol import OperationExecutor

from .conftest import SEGMENTS, CrdClients

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120, func_only=True)]

BROKER_LOAD = {
    "msgRateIn": 120.0,
    "bytesRateIn": 12000.0,
    "msgRateOut": 0.0,
    "bytesRateOut": 0.0,
    "updatedAt": "2026-11-28T12:00:00Z",
}


async def test_a_placement_keeps_a_load_its_broker_wrote_since_the_copy_was_taken(
    crd_clients: CrdClients,
) -> None:
    ns, api, kube = crd_clients.namespace, crd_clients.api, crd_clients.kube
    cache = TopicCache(controller_url=lambda namespace, name: "")

    async def events(topic: Any, type_: str, reason: str, message: str) -> None:
        raise AssertionError(f"no event expected, got {reason}: {message}")

    executor = OperationExecutor(kube, BrokerAdmin(), cache, events=events)
    wanted = {"broker": {"pod": "broker-0", "url": "http://broker-0"}, "state": "Active"}
    # A real owner: the garbage collector deletes a Segment whose topic does not exist.
    topic = await crd_clients.create_topic("placed", initial_segments=2)
    created = await crd_clients.create_first_segments(topic)
    quiet, reported = created
    await api.patch_status(SEGMENTS, ns, reported["metadata"]["name"], {"load": BROKER_LOAD})

    await executor._record_placement(quiet, wanted)
    await executor._record_placement(reported, wanted)

    now_quiet = await api.get(SEGMENTS, ns, quiet["metadata"]["name"])
    assert now_quiet["status"]["broker"] == wanted["broker"]
    assert now_quiet["status"]["load"]["msgRateIn"] == 0.0, "the zero load of a new segment"
    now_reported = await api.get(SEGMENTS, ns, reported["metadata"]["name"])
    assert now_reported["status"]["broker"] == wanted["broker"]
    assert now_reported["status"]["state"] == "Active"
    assert now_reported["status"]["load"] == BROKER_LOAD, "never zero over the broker's load"
    cached = cache.segments[(ns, "placed")]
    for now in (now_quiet, now_reported):
        sid = now["spec"]["segmentId"]
        assert cached[sid]["metadata"]["resourceVersion"] == now["metadata"]["resourceVersion"]

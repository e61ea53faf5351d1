"""A Segment resource deleted while a reconcile pass runs is written again from the broker that
holds the segment, never placed afresh (docs/correctness.md, "Lost status").

The reconciler's Segments collaborator, the executor and the cache are the real objects and
the two brokers are real in-process brokers; the Segment resources live in an in-memory
stand-in of the API server, because the point is an interleaving the real one cannot be made
to produce on purpose: the watch's DELETED event of a Segment handled while the pass awaits,
after its listing saw the Segment (the integration test
``test_a_deleted_segment_resource_is_written_again_from_its_broker`` in
``test_operator_lost_status.py`` hit it about one run in three).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from scalable_topics.controller.brokers import BrokerAdmin
from scalable_topics.controller.cache import TopicCache
from scalable_topics.controller.kube import Conflict, KubeApi, NotFound
from scalable_topics.controller.protocol import OperationExecutor
from scalable_topics.controller.segments import SegmentKeeper
from scalable_topics.core.jsontypes import JsonObj
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.resources import parse_topic_spec, segment_manifest, segment_name
from scalable_topics.core.transfer import recorded_broker
from scalable_topics.core.wire import Successor
from segment_broker.testing import RunningBroker, running_broker

NAMESPACE = "recovery-test"
TOPIC = "gone"


@dataclass
class World:
    cache: TopicCache
    segments: SegmentKeeper
    admin: BrokerAdmin
    brokers: dict[str, RunningBroker]
    topic: JsonObj
    layout: SegmentLayout
    stored: dict[str, JsonObj] = field(default_factory=dict)
    """Segment name → the Segment resource as the API server holds it."""
    events: list[tuple[str, str]] = field(default_factory=list)
    after_listing: Callable[[], None] | None = None
    """Run once, when the next listing of Segments has been served."""

    def delete(self, segment_id: int) -> None:
        """Delete the Segment and hand its DELETED event to the cache, as the watch does."""
        body = self.stored.pop(segment_name(TOPIC, segment_id))
        self.cache.drop_segment(copy.deepcopy(body))

    def broker_of(self, segment_id: int) -> str | None:
        body = self.stored.get(segment_name(TOPIC, segment_id))
        return None if body is None else recorded_broker(body)


def _in_memory_segments(kube: KubeApi, world: list[World]) -> None:
    """Segments and events kept in the test instead of an API server (uids as it gives them)."""
    uids = itertools.count(1)
    versions = itertools.count(1)

    async def list_segments(namespace: str, topic: str) -> list[JsonObj]:
        listed = [copy.deepcopy(b) for b in world[0].stored.values()]
        hook, world[0].after_listing = world[0].after_listing, None
        if hook is not None:
            hook()
        return listed

    async def create_segment(body: JsonObj) -> JsonObj:
        name = body["metadata"]["name"]
        if name not in world[0].stored:
            created = copy.deepcopy(body)
            created["metadata"]["uid"] = f"uid-{next(uids)}"
            created["metadata"]["resourceVersion"] = str(next(versions))
            world[0].stored[name] = created
        return copy.deepcopy(world[0].stored[name])

    async def get_segment(namespace: str, name: str) -> JsonObj | None:
        stored = world[0].stored.get(name)
        return None if stored is None else copy.deepcopy(stored)

    async def patch_segment_status(
        namespace: str, name: str, status: JsonObj, *, resource_version: str | None = None
    ) -> JsonObj:
        if name not in world[0].stored:
            raise NotFound(name)
        stored = world[0].stored[name]
        if resource_version is not None and resource_version != stored["metadata"].get(
            "resourceVersion"
        ):
            raise Conflict(name)
        stored["status"] = {**(stored.get("status") or {}), **status}
        stored["metadata"]["resourceVersion"] = str(next(versions))
        return copy.deepcopy(stored)

    async def post_event(
        obj: JsonObj, *, type_: str, reason: str, message: str, component: str
    ) -> None:
        world[0].events.append((reason, message))

    kube.list_segments = list_segments  # type: ignore[method-assign]
    kube.create_segment = create_segment  # type: ignore[method-assign]
    kube.get_segment = get_segment  # type: ignore[method-assign]
    kube.patch_segment_status = patch_segment_status  # type: ignore[method-assign]
    kube.post_event = post_event  # type: ignore[method-assign]


def _pod(name: str, url: str) -> JsonObj:
    host = url.removeprefix("http://").rsplit(":", 1)[0]
    return {
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"pod-{name}"},
        "status": {"podIP": host, "conditions": [{"type": "Ready", "status": "True"}]},
    }


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    """#0 and #1 split into #2 and #3 (#1 sealed), every segment on broker-0 with its Segment;
    broker-1 holds nothing, so a segment placed afresh would go there."""
    async with (
        running_broker(tmp_path / "broker-0") as first,
        running_broker(tmp_path / "broker-1") as second,
    ):
        brokers = {"broker-0": first, "broker-1": second}
        admin = BrokerAdmin()
        api = k8s.ApiClient()
        kube = KubeApi(api)
        cache = TopicCache(controller_url=lambda namespace, name: "http://controller")
        for pod, running in brokers.items():
            cache.put_pod(_pod(pod, running.url))
            # One port per in-process broker, on the same address: the URL the pod stands for.
            cache.brokers[pod] = dataclasses.replace(cache.brokers[pod], url=running.url)
        holder: list[World] = []

        async def events(topic: JsonObj, type_: str, reason: str, message: str) -> None:
            holder[0].events.append((reason, message))

        executor = OperationExecutor(kube, admin, cache, events=events)
        segments = SegmentKeeper(kube, admin, cache, executor, events=events)
        layout = SegmentLayout.initial(2).split(1)
        topic: JsonObj = {
            "metadata": {"namespace": NAMESPACE, "name": TOPIC, "uid": "topic-uid"},
            "spec": {"initialSegments": 2},
        }
        world = World(cache, segments, admin, brokers, topic, layout)
        holder.append(world)
        _in_memory_segments(kube, holder)
        broker = admin.at(first.url)
        for info in layout.segments.values():
            await broker.create_segment(
                NAMESPACE, TOPIC, info.segment_id, info.hash_range.start, info.hash_range.end
            )
            body = segment_manifest(
                topic=TOPIC,
                namespace=NAMESPACE,
                topic_uid=topic["metadata"]["uid"],
                segment_id=info.segment_id,
                hash_range=info.hash_range,
                parents=info.parent_ids,
            )
            created = await kube.create_segment(body)
            world.stored[created["metadata"]["name"]]["status"] = {
                "state": "Active" if info.active else "Sealed",
                "broker": {"pod": "broker-0", "url": first.url},
                "subscriptions": [],
                "createdAtEpoch": info.created_at_epoch,
                "sealedAtEpoch": info.sealed_at_epoch or None,
            }
            cache.put_segment(copy.deepcopy(world.stored[created["metadata"]["name"]]))
        children = [layout.segments[c] for c in layout.children(1)]
        await broker.terminate(
            NAMESPACE,
            TOPIC,
            1,
            [
                Successor(c.segment_id, c.hash_range.start, c.hash_range.end, first.url)
                for c in children
            ],
        )
        try:
            yield world
        finally:
            await admin.close()
            await api.close()


async def _passes(world: World, count: int) -> None:
    """``count`` passes over the topic's Segments (the deletions queue one pass each)."""
    spec = parse_topic_spec(world.topic.get("spec"))
    for _ in range(count):
        await world.segments.ensure(world.topic, world.layout, spec)


def _recovered(world: World) -> list[str]:
    return [message for reason, message in world.events if reason == "SegmentsRecovered"]


async def test_a_segment_deleted_while_the_pass_awaits_is_recovered_not_placed(
    world: World,
) -> None:
    """#1's deletion starts a pass; its listing still has #3, whose DELETED event is handled
    while the pass asks the brokers about #1."""

    def deleted_after_the_listing() -> None:
        asyncio.get_running_loop().call_soon(world.delete, 3)

    world.delete(1)
    world.after_listing = deleted_after_the_listing
    await _passes(world, 2)
    assert world.broker_of(1) == "broker-0"
    assert world.broker_of(3) == "broker-0", "placed afresh, away from its data"
    assert not [m for reason, m in world.events if reason == "Placed"], world.events
    recovered = " ".join(_recovered(world))
    assert "#1 on broker-0" in recovered and "#3 on broker-0" in recovered, world.events
    assert world.stored[segment_name(TOPIC, 3)]["status"]["state"] == "Active"
    assert world.stored[segment_name(TOPIC, 1)]["status"]["state"] == "Sealed"


async def test_a_listing_read_after_the_deletion_does_not_bring_the_segment_back(
    world: World,
) -> None:
    """The listing was served before #3 was deleted and read after its DELETED event: the
    cache must not take #3 back from it, or no later pass would look for it."""
    world.delete(1)
    world.after_listing = lambda: world.delete(3)
    await _passes(world, 2)
    assert 3 in world.cache.segments[(NAMESPACE, TOPIC)]
    assert world.broker_of(3) == "broker-0", world.events
    assert "#3 on broker-0" in " ".join(_recovered(world)), world.events


def test_a_deleted_segment_is_dropped_only_as_the_uid_it_was() -> None:
    """A late DELETED event of the old object does not drop the Segment written again."""
    cache = TopicCache(controller_url=lambda namespace, name: "")
    layout = SegmentLayout.initial(1)
    old: dict[str, Any] = segment_manifest(
        topic=TOPIC,
        namespace=NAMESPACE,
        topic_uid="t",
        segment_id=0,
        hash_range=layout.segments[0].hash_range,
    )
    old["metadata"]["uid"] = "old"
    new = copy.deepcopy(old)
    new["metadata"]["uid"] = "new"
    cache.put_segment(new)
    cache.drop_segment(old)
    assert cache.segments[(NAMESPACE, TOPIC)][0]["metadata"]["uid"] == "new"
    cache.drop_segment(new)
    cache.put_segment(copy.deepcopy(new))
    assert 0 not in cache.segments[(NAMESPACE, TOPIC)]

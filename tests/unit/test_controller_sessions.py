"""The operator's session server (controller.sessions + controller.consumers) on a real aiohttp
server on 127.0.0.1, with the real SubscriptionCoordinator and an in-memory topic cache."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import ClientWebSocketResponse, WSMsgType, web
from aiohttp.test_utils import TestClient, TestServer

from scalable_topics.client.dag import DagWatcher
from scalable_topics.controller.consumers import ConsumerHub
from scalable_topics.controller.consumers.state import subscription_entry
from scalable_topics.controller.sessions import make_app
from scalable_topics.core.assignment import SubscriptionCoordinator
from scalable_topics.core.buckets import bucket_boundaries
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.sessions import (
    AssignmentMessage,
    CloseCode,
    DagMessage,
    ErrorCode,
    ErrorMessage,
    RedirectMessage,
    consumers_path,
    dag_path,
    parse_server_message,
)
from tests.memory_dags import MemoryDagSource

NS, TOPIC, SUB = "default", "orders", "billing"
WS_HEADERS = {
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}


@dataclass
class StaticRouting:
    """Shard routing as ShardLeadership answers it: ``url`` is this replica's, ``leader`` the
    Lease holder's as last observed (possibly this replica's own, stale, after losing it)."""

    url: str
    leader: str
    leading: bool

    def leads(self, namespace: str, name: str) -> bool:
        return self.leading

    def leader_url(self, namespace: str, name: str) -> str:
        return self.url if self.leading else self.leader


# -- harness ----------------------------------------------------------------------------------


@dataclass
class Replica:
    dags: MemoryDagSource
    routing: StaticRouting
    hub: ConsumerHub
    client: TestClient[web.Request, web.Application]
    persisted: list[tuple[str, str, str, dict[str, Any]]] = field(default_factory=list)
    changed: list[tuple[str, str]] = field(default_factory=list)
    healthy: bool = True
    is_ready: bool = True

    def coordinator(self) -> SubscriptionCoordinator:
        coordinator = self.hub.coordinator(NS, TOPIC, SUB)
        assert isinstance(coordinator, SubscriptionCoordinator)
        return coordinator

    async def connect(
        self, consumer: str, subscription: str = SUB, consumer_type: str = "stream"
    ) -> ClientWebSocketResponse:
        ws = await self.client.ws_connect(consumers_path(NS, TOPIC))
        await ws.send_json(
            {
                "v": 1,
                "type": "register",
                "subscription": subscription,
                "consumer": consumer,
                "consumerType": consumer_type,
            }
        )
        return ws


PersistHook = Callable[[str, str, str, dict[str, Any]], Awaitable[None]]


async def start_replica(
    *,
    grace_period: float = 30.0,
    segments: int = 4,
    clock: Callable[[], float] = time.time,
    persist_hook: PersistHook | None = None,
    leader: bool = True,
    strategies: Mapping[str, str] | None = None,
    restore: bool = True,
    heartbeat: float = 5.0,
) -> Replica:
    own_url = "http://this-replica:8080"
    dags = MemoryDagSource(controller_url=own_url)
    routing = StaticRouting(own_url, own_url if leader else "http://leader.test:8080", leader)
    persisted: list[tuple[str, str, str, dict[str, Any]]] = []
    changed: list[tuple[str, str]] = []

    async def persist(ns: str, topic: str, sub: str, status: dict[str, Any]) -> None:
        if persist_hook is not None:
            await persist_hook(ns, topic, sub, status)
        persisted.append((ns, topic, sub, status))

    hub = ConsumerHub(
        persist=persist, on_consumers_changed=lambda ns, t: changed.append((ns, t)), clock=clock
    )
    replica: Replica
    app = make_app(
        dags,
        routing,
        hub,
        health=lambda: replica.healthy,
        ready=lambda: replica.is_ready,
        heartbeat=heartbeat,
    )
    client: TestClient[web.Request, web.Application] = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    replica = Replica(dags, routing, hub, client, persisted, changed)
    layout = SegmentLayout.initial(segments)
    dags.publish_layout(NS, TOPIC, layout)
    if restore:
        hub.restore(
            NS,
            TOPIC,
            layout,
            [],
            grace_period=grace_period,
            strategies=strategies if strategies is not None else {SUB: "sticky"},
        )
    return replica


@pytest.fixture
async def replicas() -> AsyncIterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for replica in started:
        await replica.client.close()


async def wait_for(predicate: Callable[[], bool], within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


async def receive(ws: ClientWebSocketResponse, within: float = 5.0) -> Any:
    message = await ws.receive(timeout=within)
    assert message.type is WSMsgType.TEXT, message
    return parse_server_message(message.data)


async def assignment_where(
    ws: ClientWebSocketResponse,
    predicate: Callable[[AssignmentMessage], bool] = lambda _: True,
    within: float = 5.0,
) -> AssignmentMessage:
    """Read assignment messages until one satisfies ``predicate`` (assignments are full states;
    intermediate ones may be skipped by the server)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        message = await receive(ws, max(0.01, deadline - loop.time()))
        assert isinstance(message, AssignmentMessage), message
        if predicate(message):
            return message


async def closed_with(ws: ClientWebSocketResponse, within: float = 5.0) -> tuple[Any, int]:
    """The last message before the close frame, and the close code."""
    last = None
    while True:
        message = await ws.receive(timeout=within)
        if message.type is WSMsgType.TEXT:
            last = parse_server_message(message.data)
            continue
        assert message.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING), message
        assert ws.close_code is not None
        return last, ws.close_code


def ids(message: AssignmentMessage) -> set[int]:
    return {s.segment_id for s in message.segments}


# -- DAG watch --------------------------------------------------------------------------------


async def test_dag_watch_sends_the_full_dag_then_every_change(replicas: list[Replica]) -> None:
    replica = await start_replica(segments=2)
    replicas.append(replica)
    layout = SegmentLayout.initial(2).split(0)
    replica.dags.publish_layout(NS, TOPIC, layout)

    ws = await replica.client.ws_connect(dag_path(NS, TOPIC))
    first = await receive(ws)
    assert isinstance(first, DagMessage)
    assert first.epoch == 1 and first.controller_url == "http://this-replica:8080"
    assert {s.segment_id for s in first.segments} == {0, 1, 2, 3}
    for segment in first.segments:
        assert segment.broker_url == f"http://broker-{segment.segment_id % 3}.test:8080"
        assert segment.buckets is not None
        assert list(segment.bucket_boundaries) == bucket_boundaries(segment.buckets)
    assert first.to_layout() == layout

    replica.dags.publish_layout(NS, TOPIC, layout.split(3))
    second = await receive(ws)
    assert isinstance(second, DagMessage)
    assert second.epoch == 2
    assert {s.segment_id for s in second.active()} == {1, 2, 4, 5}
    await ws.close()
    await wait_for(lambda: replica.dags.watchers(NS, TOPIC) == 0)


async def test_dag_plain_get_and_unknown_topics(replicas: list[Replica]) -> None:
    replica = await start_replica()
    replicas.append(replica)
    response = await replica.client.get(dag_path(NS, TOPIC))
    assert response.status == 200
    body = await response.json()
    assert body["type"] == "dag" and body["topic"] == TOPIC and len(body["segments"]) == 4
    assert body["segments"][0]["brokerUrl"] == "http://broker-0.test:8080"

    response = await replica.client.get(dag_path(NS, "missing"))
    assert response.status == 404
    assert (await response.json())["error"] == "UnknownTopic"

    ws = await replica.client.ws_connect(dag_path(NS, "missing"))
    last, code = await closed_with(ws)
    assert code == CloseCode.UNKNOWN_TOPIC
    assert isinstance(last, ErrorMessage) and last.code is ErrorCode.UNKNOWN_TOPIC

    ws = await replica.client.ws_connect(dag_path(NS, TOPIC))
    assert isinstance(await receive(ws), DagMessage)
    replica.dags.delete(NS, TOPIC)
    last, code = await closed_with(ws)
    assert code == CloseCode.UNKNOWN_TOPIC and "deleted" in last.message


async def test_a_replica_not_synced_yet_answers_unknown_topics_retry_not_not_found(
    replicas: list[Replica], caplog: pytest.LogCaptureFixture
) -> None:
    """A replica that has not read the whole cluster yet (``controller.initialsync``) cannot
    tell a client a topic does not exist: 503 with Retry-After, which the client retries, not
    the final UnknownTopic. A topic it already holds is served."""
    replica = await start_replica()
    replicas.append(replica)
    replica.is_ready = False
    response = await replica.client.get(dag_path(NS, "missing"))
    assert response.status == 503, await response.text()
    assert (await response.json())["error"] == "NotReady"
    assert response.headers["Retry-After"]
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await replica.client.ws_connect(dag_path(NS, "missing"))
    assert refused.value.status == 503
    ws = await replica.client.ws_connect(dag_path(NS, TOPIC))
    assert isinstance(await receive(ws), DagMessage)
    await ws.close()

    # The SDK's watcher retries: it gets the DAG of a topic the replica comes to hold.
    caplog.set_level(logging.DEBUG, logger="scalable_topics.client.dag")
    watcher = DagWatcher(str(replica.client.make_url("/")), NS, "missing")
    starting = asyncio.create_task(watcher.start())
    await wait_for(lambda: any("503" in r.getMessage() for r in caplog.records))
    assert not starting.done()
    replica.dags.publish_layout(NS, "missing", SegmentLayout.initial(2))
    replica.is_ready = True
    dag = await asyncio.wait_for(starting, 10.0)
    assert dag.topic == "missing" and len(dag.active()) == 2
    await watcher.close()

    response = await replica.client.get(dag_path(NS, "other"))
    assert response.status == 404


async def test_a_slow_dag_watcher_blocks_nobody(replicas: list[Replica]) -> None:
    # The stalled reader answers no ping: a heartbeat shorter than the fast reader's 24 MB on a
    # loaded machine would close it, which is not what this test is about.
    replica = await start_replica(segments=1, heartbeat=120.0)
    replicas.append(replica)
    # ~1 MB per DAG message, 24 versions: far more than the socket buffers of a stalled reader
    layout = SegmentLayout.initial(1500)
    replica.dags.publish_layout(NS, TOPIC, layout, bucket_budget=1500 * 48)
    slow = await replica.client.ws_connect(dag_path(NS, TOPIC), max_msg_size=0)
    fast = await replica.client.ws_connect(dag_path(NS, TOPIC), max_msg_size=0)
    assert (await receive(slow, within=20)).epoch == 0
    assert (await receive(fast, within=20)).epoch == 0

    versions = 24
    for i in range(versions):
        layout = layout.split(i)
        replica.dags.publish_layout(NS, TOPIC, layout)
        await asyncio.sleep(0)  # let the server pick each version up
    seen_fast: list[int] = []
    while not seen_fast or seen_fast[-1] < versions:
        seen_fast.append((await receive(fast, within=20)).epoch)
    assert seen_fast == sorted(seen_fast)

    seen_slow: list[int] = []
    while not seen_slow or seen_slow[-1] < versions:
        seen_slow.append((await receive(slow, within=20)).epoch)
    assert seen_slow == sorted(seen_slow)
    assert len(seen_slow) < versions, "the stalled watcher was sent every version"
    await slow.close()
    await fast.close()


# -- consumer sessions ------------------------------------------------------------------------


async def test_consumers_get_balanced_assignments_and_a_third_takes_its_share(
    replicas: list[Replica],
) -> None:
    replica = await start_replica()
    replicas.append(replica)
    c1 = await replica.connect("c1")
    first = await assignment_where(c1)
    assert ids(first) == {0, 1, 2, 3}
    assert first.namespace == NS and first.topic == TOPIC and first.subscription == SUB
    assert all(s.consumable and s.broker_url for s in first.segments)
    assert {s.segment_id: s.broker_url for s in first.segments} == replica.dags.dag(
        NS, TOPIC
    ).brokers()  # type: ignore[union-attr]

    c2 = await replica.connect("c2")
    a2 = await assignment_where(c2)
    a1 = await assignment_where(c1, lambda m: len(m.segments) == 2)
    assert len(a2.segments) == 2 and ids(a1).isdisjoint(ids(a2))
    assert replica.hub.stream_consumer_counts(NS, TOPIC) == {SUB: 2}
    await wait_for(lambda: len(replica.changed) >= 2)

    c3 = await replica.connect("c3")
    a3 = await assignment_where(c3)
    assert len(a3.segments) == 1
    moved = next(iter(ids(a3)))
    donor = c1 if moved in ids(a1) else c2
    after = await assignment_where(donor, lambda m: len(m.segments) == 1)
    assert moved not in ids(after)
    assignments = replica.coordinator().assignments()
    assert sorted(len(a.segments) for a in assignments.values()) == [1, 1, 2]
    assert replica.hub.stream_consumer_counts(NS, TOPIC) == {SUB: 3}
    for ws in (c1, c2, c3):
        await ws.close()


async def test_reconnect_within_the_grace_period_gets_the_same_segments(
    replicas: list[Replica],
) -> None:
    replica = await start_replica(grace_period=30.0)
    replicas.append(replica)
    c1 = await replica.connect("c1")
    await assignment_where(c1)
    c2 = await replica.connect("c2")
    held = ids(await assignment_where(c2))
    await assignment_where(c1, lambda m: len(m.segments) == 2)

    await c2.close()
    await wait_for(lambda: not replica.coordinator().sessions()["c2"].connected)
    assert replica.hub.stream_consumer_counts(NS, TOPIC) == {SUB: 2}
    c2 = await replica.connect("c2")
    assert ids(await assignment_where(c2)) == held
    assert replica.coordinator().connected() == ["c1", "c2"]
    await c1.close()
    await c2.close()


async def test_grace_expiry_redistributes_on_time(replicas: list[Replica]) -> None:
    clock = time.monotonic
    replica = await start_replica(grace_period=0.2, clock=clock)
    replicas.append(replica)
    c1 = await replica.connect("c1")
    await assignment_where(c1)
    c2 = await replica.connect("c2")
    await assignment_where(c2)
    await assignment_where(c1, lambda m: len(m.segments) == 2)
    changes_before = len(replica.changed)

    # the grace period starts when the server sees the close, which may be before close()
    # returns: measure from before it
    closing_at = clock()
    await c2.close()
    everything = await assignment_where(c1, lambda m: len(m.segments) == 4)
    assert ids(everything) == {0, 1, 2, 3}
    assert clock() - closing_at >= 0.2
    assert replica.hub.stream_consumer_counts(NS, TOPIC) == {SUB: 1}
    await wait_for(lambda: [c["name"] for c in replica.persisted[-1][3]["consumers"]] == ["c1"])
    assert len(replica.changed) > changes_before
    await c1.close()


async def test_drain_reports_ungate_split_children(replicas: list[Replica]) -> None:
    replica = await start_replica(segments=2)
    replicas.append(replica)
    c1 = await replica.connect("c1")
    assert ids(await assignment_where(c1)) == {0, 1}

    # the reconciler commits a split; the topic cache learns the children's brokers later
    split = SegmentLayout.initial(2).split(0)
    replica.hub.layout_changed(NS, TOPIC, split)
    gated = await assignment_where(c1, lambda m: m.layout_epoch == 1)
    by_id = {s.segment_id: s for s in gated.segments}
    assert set(by_id) == {0, 1, 2, 3}
    assert by_id[0].state == "SEALED" and by_id[0].consumable
    assert not by_id[2].consumable and by_id[2].blocked_by == (0,)
    assert by_id[2].broker_url is None

    replica.dags.publish_layout(NS, TOPIC, split)
    placed = await assignment_where(c1, lambda m: all(s.broker_url for s in m.segments))
    assert ids(placed) == {0, 1, 2, 3}

    # a report the coordinator refuses (a child still gated) is answered, the session stays
    await c1.send_json({"v": 1, "type": "drained", "segment": 2})
    error = await receive(c1)
    assert isinstance(error, ErrorMessage) and error.code is ErrorCode.REJECTED
    assert not error.fatal and "only sealed segments drain" in error.message

    await c1.send_json({"v": 1, "type": "position", "segment": 0, "position": 41})
    await c1.send_json({"v": 1, "type": "drained", "segment": 0})
    ungated = await assignment_where(c1, lambda m: 0 not in ids(m))
    assert ids(ungated) == {1, 2, 3}
    assert all(s.consumable for s in ungated.segments)
    assert replica.hub.positions(NS, TOPIC, SUB) == {"c1": {0: 41}}
    await wait_for(lambda: replica.persisted[-1][3]["drainedSegments"] == [0])
    await c1.close()


async def test_controller_observed_drain_ungates_children(replicas: list[Replica]) -> None:
    replica = await start_replica(segments=2)
    replicas.append(replica)
    c1 = await replica.connect("c1")
    await assignment_where(c1)
    c2 = await replica.connect("c2")
    await assignment_where(c2)
    merged = SegmentLayout.initial(2).merge(0, 1)
    replica.dags.publish_layout(NS, TOPIC, merged)
    replica.hub.layout_changed(NS, TOPIC, merged)
    await wait_for(lambda: not replica.coordinator().is_consumable(2))
    replica.hub.segment_drained(NS, TOPIC, SUB, 0)
    replica.hub.segment_drained(NS, TOPIC, SUB, 1)
    owner = replica.coordinator().owner_of(2)
    ws = c1 if owner == "c1" else c2
    final = await assignment_where(ws, lambda m: ids(m) == {2} and m.segments[0].consumable)
    assert final.layout_epoch == 1
    await c1.close()
    await c2.close()


async def test_persist_gets_the_coordinator_status_coalesced(replicas: list[Replica]) -> None:
    gate = asyncio.Event()
    in_flight = 0
    most_in_flight = 0

    async def slow_persist(ns: str, topic: str, sub: str, status: dict[str, Any]) -> None:
        nonlocal in_flight, most_in_flight
        in_flight += 1
        most_in_flight = max(most_in_flight, in_flight)
        try:
            await gate.wait()
        finally:
            in_flight -= 1

    replica = await start_replica(persist_hook=slow_persist)
    replicas.append(replica)
    await wait_for(lambda: in_flight == 1)  # restore() writes the new subscription's status
    sockets = []
    for name in ("c1", "c2", "c3"):
        sockets.append(await replica.connect(name))
        await assignment_where(sockets[-1])
    assert replica.persisted == []
    gate.set()
    expected = replica.coordinator().to_status()
    await wait_for(lambda: len(replica.persisted) == 2)
    assert most_in_flight == 1
    assert replica.persisted[0][:3] == (NS, TOPIC, SUB)
    assert replica.persisted[0][3]["consumers"] == []
    assert replica.persisted[1][3] == expected
    assert [c["name"] for c in expected["consumers"]] == ["c1", "c2", "c3"]
    await asyncio.sleep(0.05)  # nothing else is pending
    assert len(replica.persisted) == 2
    for ws in sockets:
        await ws.close()


async def test_a_non_leader_redirects_to_the_leader(replicas: list[Replica]) -> None:
    leader = await start_replica()
    follower = await start_replica(leader=False)
    replicas.extend([leader, follower])
    leader_url = str(leader.client.make_url("")).rstrip("/")
    follower.routing.leader = leader_url

    path = consumers_path(NS, TOPIC)
    response = await follower.client.get(path, headers=WS_HEADERS, allow_redirects=False)
    assert response.status == 307
    location = response.headers["Location"]
    assert location == leader_url + path

    ws = await leader.client.session.ws_connect(location)
    await ws.send_json({"v": 1, "type": "register", "subscription": SUB, "consumer": "c1"})
    assert ids(await assignment_where(ws)) == {0, 1, 2, 3}
    await ws.close()

    # no leader known, or only this replica's own stale record: retry later, no self-redirect
    for stale in ("", follower.routing.url):
        follower.routing.leader = stale
        response = await follower.client.get(path, headers=WS_HEADERS, allow_redirects=False)
        assert response.status == 503 and response.headers["Retry-After"] == "1"


async def test_the_newer_session_of_a_consumer_wins(replicas: list[Replica]) -> None:
    replica = await start_replica()
    replicas.append(replica)
    old = await replica.connect("c1")
    await assignment_where(old)
    new = await replica.connect("c1")
    assert ids(await assignment_where(new)) == {0, 1, 2, 3}
    last, code = await closed_with(old)
    assert code == CloseCode.SUPERSEDED
    assert isinstance(last, ErrorMessage) and last.code is ErrorCode.SUPERSEDED
    await asyncio.sleep(0.05)  # the old socket's close must not count as a disconnect
    assert replica.coordinator().sessions()["c1"].connected
    assert replica.hub.session_count() == 1
    await new.send_json({"v": 1, "type": "unregister"})
    _, code = await closed_with(new)
    assert code == CloseCode.NORMAL
    assert replica.coordinator().sessions() == {}


async def test_bad_clients_are_closed_and_others_still_served(replicas: list[Replica]) -> None:
    replica = await start_replica(strategies={SUB: "sticky", "audit": "round-robin"})
    replicas.append(replica)
    good = await replica.connect("good")
    await assignment_where(good)

    bad = await replica.connect("bad")
    await assignment_where(bad)
    await bad.send_str("{not json")
    last, code = await closed_with(bad)
    assert code == CloseCode.BAD_MESSAGE
    assert isinstance(last, ErrorMessage) and last.code is ErrorCode.BAD_MESSAGE

    for payload, expected in [
        ('{"v": 1, "type": "drained", "segment": 0}', CloseCode.BAD_MESSAGE),  # no register
        ('{"v": 9, "type": "register", "subscription": "billing", "consumer": "x"}', 4400),
        ('{"v": 1, "type": "register", "subscription": "events", "consumer": "x"}', 4422),
    ]:
        ws = await replica.client.ws_connect(consumers_path(NS, TOPIC))
        await ws.send_str(payload)
        last, code = await closed_with(ws)
        assert code == expected, payload
        assert isinstance(last, ErrorMessage)
    ws = await replica.client.ws_connect(consumers_path(NS, TOPIC))
    await ws.send_bytes(b"\x00\x01")
    _, code = await closed_with(ws)
    assert code == CloseCode.BAD_MESSAGE

    twice = await replica.connect("twice", subscription="audit", consumer_type="checkpoint")
    assert ids(await assignment_where(twice)) == {0, 1, 2, 3}
    await twice.send_json({"v": 1, "type": "register", "subscription": "audit", "consumer": "y"})
    _, code = await closed_with(twice)
    assert code == CloseCode.BAD_MESSAGE

    unknown = await replica.client.ws_connect(consumers_path(NS, "missing"))
    last, code = await closed_with(unknown)
    assert code == CloseCode.UNKNOWN_TOPIC and last.code is ErrorCode.UNKNOWN_TOPIC

    # the server still serves: a new consumer joins and gets a share from the good one (the
    # bad one is in its grace period: its two segments are frozen)
    late = await replica.connect("late")
    assert len((await assignment_where(late)).segments) == 1
    await assignment_where(good, lambda m: len(m.segments) == 1)
    assert not replica.coordinator().sessions()["bad"].connected
    for ws in (good, late):
        await ws.close()


async def test_restore_gives_every_persisted_consumer_a_fresh_grace_period(
    replicas: list[Replica],
) -> None:
    layout = SegmentLayout.initial(4)
    previous = SubscriptionCoordinator(layout)
    previous.register("c1", 0.0)
    previous.register("c2", 0.0)
    status = {"name": SUB, "type": "Stream", **previous.to_status()}
    c1_segments = set(previous.assignment("c1").segment_ids)

    clock = time.monotonic
    replica = await start_replica(clock=clock, restore=False)
    replicas.append(replica)
    response = await replica.client.get(consumers_path(NS, TOPIC), headers=WS_HEADERS)
    assert response.status == 503  # leader, but the topic is not taken over yet
    restored_at = clock()
    replica.hub.restore(NS, TOPIC, layout, [status], grace_period=0.3, strategies={SUB: "sticky"})
    sessions = replica.coordinator().sessions()
    assert set(sessions) == {"c1", "c2"}
    for session in sessions.values():
        assert not session.connected
        assert session.grace_deadline is not None
        assert restored_at <= session.grace_deadline - 0.3 <= clock()
    assert replica.hub.stream_consumer_counts(NS, TOPIC) == {SUB: 2}
    assert replica.persisted == []  # the status was current: nothing to write back

    c1 = await replica.connect("c1")
    assert ids(await assignment_where(c1)) == c1_segments
    everything = await assignment_where(c1, lambda m: len(m.segments) == 4)
    assert ids(everything) == {0, 1, 2, 3}
    await wait_for(lambda: bool(replica.persisted))
    assert [c["name"] for c in replica.persisted[-1][3]["consumers"]] == ["c1"]
    await c1.close()


async def test_forget_topic_redirects_or_reports_deletion(replicas: list[Replica]) -> None:
    replica = await start_replica()
    replicas.append(replica)
    c1 = await replica.connect("c1")
    await assignment_where(c1)
    replica.routing.leading = False
    replica.routing.leader = "http://new-leader.test:8080"
    replica.hub.forget_topic(NS, TOPIC)
    last, code = await closed_with(c1)
    assert code == CloseCode.MOVED
    assert isinstance(last, RedirectMessage)
    assert last.url == "http://new-leader.test:8080" + consumers_path(NS, TOPIC)
    assert replica.hub.stream_consumer_counts(NS, TOPIC) == {}

    # lost, and the Lease still names this replica: a retry hint instead of a self-redirect
    replica.routing.leading = True
    replica.hub.restore(
        NS, TOPIC, SegmentLayout.initial(4), [], grace_period=30, strategies={SUB: "sticky"}
    )
    c1 = await replica.connect("c1")
    await assignment_where(c1)
    replica.routing.leading = False
    replica.routing.leader = replica.routing.url
    replica.hub.forget_topic(NS, TOPIC)
    last, code = await closed_with(c1)
    assert code == CloseCode.UNAVAILABLE
    assert isinstance(last, RedirectMessage) and last.url is None and last.retry_after > 0

    replica.routing.leading = True
    replica.hub.restore(
        NS, TOPIC, SegmentLayout.initial(4), [], grace_period=30, strategies={SUB: "sticky"}
    )
    c1 = await replica.connect("c1")
    await assignment_where(c1)
    replica.dags.delete(NS, TOPIC)
    replica.hub.forget_topic(NS, TOPIC)
    last, code = await closed_with(c1)
    assert code == CloseCode.UNKNOWN_TOPIC and last.code is ErrorCode.UNKNOWN_TOPIC


async def test_spec_changes_through_restore(replicas: list[Replica]) -> None:
    replica = await start_replica(strategies={SUB: "sticky", "audit": "sticky"})
    replicas.append(replica)
    c1 = await replica.connect("c1")
    await assignment_where(c1)
    a1 = await replica.connect("a1", subscription="audit")
    await assignment_where(a1)
    a2 = await replica.connect("a2", subscription="audit")
    await assignment_where(a2)
    layout = SegmentLayout.initial(4)

    replica.hub.restore(NS, TOPIC, layout, [], grace_period=30.0, strategies={SUB: "round-robin"})
    last, code = await closed_with(a1)
    assert code == CloseCode.INVALID_SUBSCRIPTION and last.code is ErrorCode.INVALID_SUBSCRIPTION
    coordinator = replica.coordinator()
    assert coordinator.strategy == "round-robin"
    assert coordinator.connected() == ["c1"]
    assert replica.hub.coordinator(NS, TOPIC, "audit") is None
    await c1.close()
    await a2.close()


async def test_metrics_health_and_readiness(replicas: list[Replica]) -> None:
    replica = await start_replica()
    replicas.append(replica)
    watcher = await replica.client.ws_connect(dag_path(NS, TOPIC))
    await receive(watcher)
    consumer = await replica.connect("c1")
    await assignment_where(consumer)
    text = await (await replica.client.get("/metrics")).text()
    gauges = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("scalable_topic_sessions{")
    }
    assert gauges['scalable_topic_sessions{type="dag"}'] >= 1
    assert gauges['scalable_topic_sessions{type="consumer"}'] >= 1

    assert (await replica.client.get("/healthz")).status == 200
    assert (await replica.client.get("/readyz")).status == 200
    replica.healthy = False
    replica.is_ready = False
    assert (await replica.client.get("/healthz")).status == 503
    assert (await replica.client.get("/readyz")).status == 503
    response = await replica.client.get(consumers_path(NS, TOPIC))
    assert response.status == 426
    await watcher.close()
    await consumer.close()


async def test_close_ends_every_session(replicas: list[Replica]) -> None:
    replica = await start_replica()
    replicas.append(replica)
    c1 = await replica.connect("c1")
    await assignment_where(c1)
    closing = asyncio.create_task(replica.hub.close())
    last, code = await closed_with(c1)
    await closing
    assert code == CloseCode.GOING_AWAY
    assert isinstance(last, RedirectMessage) and last.url is None
    assert json.loads(json.dumps(replica.hub.stream_consumer_counts(NS, TOPIC))) == {}


async def test_restore_writes_back_a_status_behind_the_layout(replicas: list[Replica]) -> None:
    initial = SegmentLayout.initial(2)
    previous = SubscriptionCoordinator(initial)
    previous.register("c1", 0.0)
    status = {"name": SUB, "type": "Stream", **previous.to_status()}
    split = initial.split(0)  # committed after the registrations were last written

    replica = await start_replica(segments=2, restore=False)
    replicas.append(replica)
    replica.dags.publish_layout(NS, TOPIC, split)
    replica.hub.restore(NS, TOPIC, split, [status], grace_period=30, strategies={SUB: "sticky"})
    await wait_for(lambda: bool(replica.persisted))
    written = replica.persisted[-1][3]
    assert written["layoutEpoch"] == 1
    assert written["consumers"] == [{"name": "c1", "segments": [0, 1, 2, 3]}]
    assert replica.changed == [(NS, TOPIC)]

    c1 = await replica.connect("c1")
    gated = await assignment_where(c1)
    assert {s.segment_id: s.consumable for s in gated.segments} == {
        0: True,
        1: True,
        2: False,
        3: False,
    }
    await c1.close()


async def test_initial_entries_are_what_restore_writes_and_then_it_writes_nothing(
    replicas: list[Replica],
) -> None:
    """A new topic's Ready write carries ``initial_entries``; the restore that follows must
    find exactly what it would have persisted (else it writes again, or serves a different
    state than a hub without them). A split layout: its sealed parent counts as drained for a
    new Stream subscription and not for a Queue one."""
    split = SegmentLayout.initial(2).split(0)
    kwargs: dict[str, Any] = {
        "grace_period": 30.0,
        "strategies": {SUB: "sticky"},
        "queues": ["jobs"],
    }
    plain = await start_replica(segments=2, restore=False)
    folded = await start_replica(segments=2, restore=False)
    replicas.extend([plain, folded])
    for replica in (plain, folded):
        replica.dags.publish_layout(NS, TOPIC, split)

    plain.hub.restore(NS, TOPIC, split, [], **kwargs)
    await wait_for(lambda: len(plain.persisted) == 2)
    persisted = {sub: subscription_entry(sub, status) for _, _, sub, status in plain.persisted}

    entries = folded.hub.initial_entries(NS, TOPIC, split, [], **kwargs)
    assert entries == [persisted[name] for name in sorted(persisted)]
    assert entries[0]["name"] == SUB and entries[0]["drainedSegments"] == [0]
    assert entries[1]["name"] == "jobs" and entries[1]["type"] == "Queue"
    folded.hub.restore(NS, TOPIC, split, entries, **kwargs)
    assert folded.coordinator().to_status() == plain.coordinator().to_status()
    # A write would be started by restore itself (a task): one loop turn shows it.
    await asyncio.sleep(0)
    assert folded.persisted == []
    # A served topic's entries are the hub's own to write.
    assert folded.hub.initial_entries(NS, TOPIC, split, [], **kwargs) == []

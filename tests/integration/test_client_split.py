"""The client SDK across splits and merges, on real broker processes and the real session server.

A producer sends keyed messages while a segment is split (or two are merged) through the
brokers' admin API in the protocol's order; a stream consumer and a queue consumer read
concurrently. Every acknowledged message must arrive, and each key's messages in order.
"""

from __future__ import annotations

import asyncio

import pytest

from scalable_topics.brokeradmin import AdminError
from scalable_topics.client import QueueConsumer, ScalableTopicProducer, StreamConsumer
from scalable_topics.core.hashing import segment_hash
from scalable_topics.core.layout import descriptor
from scalable_topics.core.wire import Successor
from segment_broker.testing import BrokerProcess

from .client_harness import (
    KeyedLoad,
    OperatorReplica,
    TopicEnv,
    check_order,
)
from .conftest import eventually

pytestmark = pytest.mark.integration

NS = "clients"
SUBS = {"stream": "Stream", "queue": "Queue"}
KEYS = [f"key-{i}" for i in range(40)]


async def _env(
    operator: OperatorReplica,
    brokers: list[BrokerProcess],
    topic: str,
    *,
    operator_placement: bool = False,
) -> TopicEnv:
    env = TopicEnv(
        operator,
        [b.url for b in brokers],
        NS,
        topic,
        subscriptions=SUBS,
        operator_placement=operator_placement,
    )
    await env.create(2)
    return env


async def _drain(
    consumer: StreamConsumer | QueueConsumer,
    load: KeyedLoad,
    done: asyncio.Event,
    out: list[tuple[str, int]],
    *,
    check_key: bool,
) -> None:
    """Read and ack until every acknowledged message of a finished load was received."""
    got: set[tuple[str, int]] = set()
    while not (done.is_set() and set(load.acked) <= got):
        try:
            async with asyncio.timeout(0.5):
                msg = await consumer.receive()
        except TimeoutError:
            continue
        item = KeyedLoad.parse(msg.value)
        if check_key:
            assert msg.key == item[0]
        out.append(item)
        got.add(item)
        await consumer.ack(msg)


async def _scenario(env: TopicEnv, change: str) -> tuple[KeyedLoad, list[int]]:
    load = KeyedLoad(KEYS)
    done = asyncio.Event()
    streamed: list[tuple[str, int]] = []
    queued: list[tuple[str, int]] = []
    async with (
        ScalableTopicProducer(env.service_url, NS, env.topic, linger_ms=2) as producer,
        StreamConsumer(env.service_url, NS, env.topic, "stream", "reader-1") as stream,
        QueueConsumer(env.service_url, NS, env.topic, "queue", "queue-1") as queue,
    ):
        readers = [
            asyncio.create_task(_drain(stream, load, done, streamed, check_key=True)),
            asyncio.create_task(_drain(queue, load, done, queued, check_key=False)),
        ]
        sending = asyncio.create_task(load.run(producer, 60, pause=0.01))
        async with asyncio.timeout(30):
            await load.wait_acked(20 * len(KEYS))
        connections = producer.connections
        children = await env.split(0) if change == "split" else await env.merge(0, 1)
        await sending
        await producer.flush()
        done.set()
        async with asyncio.timeout(60):
            await asyncio.gather(*readers)
        assert not load.errors
        assert load.sent == len(load.acked) == 60 * len(KEYS)
        # The parents' SEALING had the producer connect to the children before SEALED, once.
        assert producer.early_connects == len(children)
        assert producer.connections - connections == len(children)
        check_order(streamed, load.acked)
        check_order(queued, load.acked)
        drained = env.operator.hub.coordinator(NS, env.topic, "stream")
        assert drained is not None
        for parent in [0] if change == "split" else [0, 1]:
            await eventually(lambda p=parent: p in drained.drained_segments, within=10)  # type: ignore[misc]
            assert parent in stream.drained_segments
            assert parent in queue.drained_segments
    return load, children


@pytest.mark.parametrize("beside", [False, True], ids=["children-elsewhere", "children-beside"])
async def test_split_mid_stream_keeps_every_message_in_key_order(
    operator: OperatorReplica, brokers: list[BrokerProcess], beside: bool
) -> None:
    """Children on other brokers, opened by the controller after the seal; or placed beside
    their parent as the operator places them, and opened by the parent's seal itself."""
    env = await _env(operator, brokers, f"split-{int(beside)}", operator_placement=beside)
    try:
        load, children = await _scenario(env, "split")
        homes = {env.placement[c] for c in children}
        if beside:
            assert homes == {env.placement[0]} and env.opened_by_seal == children
        else:
            assert homes != {env.placement[0]} and env.opened_by_seal == []
        parent_range = env.layout.segments[0].hash_range
        late = [
            mid
            for (key, n), mid in load.acked.items()
            if n >= 59 and parent_range.contains(segment_hash(key))
        ]
        assert late and all(mid.segment_id in children for mid in late)
        for child in children:
            stats = await env.stats(child)
            assert stats["lastPosition"] >= 0
    finally:
        await env.close()


async def test_merge_mid_stream_keeps_every_message_in_key_order(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    env = await _env(operator, brokers, "merge")
    try:
        load, children = await _scenario(env, "merge")
        assert len(children) == 1
        late = [mid for (key, n), mid in load.acked.items() if n >= 59]
        assert all(mid.segment_id == children[0] for mid in late)
    finally:
        await env.close()


async def test_dag_push_before_seal_does_not_let_a_key_overtake_itself(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    """The DAG watch announces the children 100 ms before the parent is sealed (the producer
    hears of the split before its parent's ``SEALED``): the producer goes on without loss, in key
    order, and still re-routes on the seal. (The pinning rule that keeps a key's in-flight
    messages ahead of newer ones in the tighter race is unit-tested in test_client_routing.)"""
    env = await _env(operator, brokers, "early")
    load = KeyedLoad(KEYS)
    done = asyncio.Event()
    streamed: list[tuple[str, int]] = []
    try:
        async with (
            ScalableTopicProducer(env.service_url, NS, env.topic, linger_ms=2) as producer,
            StreamConsumer(env.service_url, NS, env.topic, "stream", "reader-1") as stream,
        ):
            reader = asyncio.create_task(_drain(stream, load, done, streamed, check_key=True))
            sending = asyncio.create_task(load.run(producer, 60, pause=0.005))
            async with asyncio.timeout(30):
                await load.wait_acked(15 * len(KEYS))
            await env.split(0, early_push=0.1)
            await sending
            await producer.flush()
            done.set()
            async with asyncio.timeout(60):
                await reader
            assert producer.reroutes == 1
            assert not load.errors and len(load.acked) == 60 * len(KEYS)
            check_order(streamed, load.acked)
    finally:
        await env.close()


async def test_successors_announced_by_a_seal_that_failed_are_given_up(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    """``SEALING`` comes before the seal is durable. When the seal then fails (here: a directory
    where the seal marker goes) and the children are deleted (the controller's rollback), the
    connections the producer opened to them ahead are given up, and it goes on producing to
    the parent, which is still open."""
    env = await _env(operator, brokers, "unsealed")
    url = env.placement[0]
    admin = env.admins[url]
    broker = next(b for b in brokers if b.url == url)
    parent = env.layout.segments[0]
    marker = broker.data_dir / NS / env.topic / descriptor(parent) / "sealed.json"
    load = KeyedLoad(KEYS)
    try:
        async with ScalableTopicProducer(env.service_url, NS, env.topic, linger_ms=2) as producer:
            sending = asyncio.create_task(load.run(producer, 40, pause=0.01))
            async with asyncio.timeout(30):
                await load.wait_acked(10 * len(KEYS))
            lo, hi = parent.hash_range.start, parent.hash_range.end
            mid = (lo + hi) // 2
            successors = [Successor(10, lo, mid, url), Successor(11, mid + 1, hi, url)]
            for child in successors:
                await admin.create_segment(
                    NS, env.topic, child.segment_id, child.start, child.end, writable=False
                )
            marker.mkdir()
            with pytest.raises(AdminError):
                await admin.terminate(NS, env.topic, 0, successors)
            await eventually(lambda: producer.early_connects == 2, within=10)
            for child in successors:
                await admin.delete_segment(NS, env.topic, child.segment_id)
            await eventually(lambda: not {10, 11} & set(producer._links), within=20)
            await sending
            await producer.flush()
        assert not load.errors and len(load.acked) == 40 * len(KEYS)
        parent_range = parent.hash_range
        assert all(
            mid_.segment_id == 0
            for (key, _), mid_ in load.acked.items()
            if parent_range.contains(segment_hash(key))
        )
        assert producer.reroutes == 0
    finally:
        marker.rmdir()
        await env.close()

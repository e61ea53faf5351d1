"""The SDK across an ownership transfer (seed 004), on real broker processes and the real session
server: a segment under keyed load moves to the other broker in the protocol's order (catch-up
copy, fence, final tail, own, release with the new owner's URL). The producer and the stream
consumer reach the new owner through the moved close frame alone: the DAG they watch still
names the old broker until after the new owner acknowledged their entries. Every acknowledged
message arrives, each key's in order."""

from __future__ import annotations

import asyncio

import pytest

from scalable_topics.client import ScalableTopicProducer, StreamConsumer
from scalable_topics.client.segment import SegmentAdmin
from scalable_topics.transferadmin import TransferAdmin, copy
from segment_broker.testing import BrokerProcess

from .client_harness import KeyedLoad, OperatorReplica, TopicEnv, check_order
from .conftest import eventually

pytestmark = pytest.mark.integration

NS = "clients"
KEYS = [f"key-{i}" for i in range(40)]


async def move(env: TopicEnv, segment_id: int, destination: str) -> int:
    """Move ``segment_id`` to ``destination`` without telling the DAG; returns the last
    position the source had acknowledged."""
    source_admin = env.admins[env.placement[segment_id]]
    src = TransferAdmin(source_admin, env.namespace, env.topic, segment_id)
    dst = TransferAdmin(env.admins[destination], env.namespace, env.topic, segment_id)
    await copy(src, dst)
    await copy(src, dst)
    fenced = await src.fence()
    tail = await copy(src, dst)
    assert tail.complete and tail.last_position == fenced["lastPosition"]
    await dst.own()
    released = await src.release(destination)
    assert released is not None
    await dst.state(released["cursors"], None)
    return int(fenced["lastPosition"])


async def _read(
    consumer: StreamConsumer, load: KeyedLoad, done: asyncio.Event, out: list[tuple[str, int]]
) -> None:
    got: set[tuple[str, int]] = set()
    while not (done.is_set() and set(load.acked) <= got):
        try:
            async with asyncio.timeout(0.5):
                msg = await consumer.receive()
        except TimeoutError:
            continue
        item = KeyedLoad.parse(msg.value)
        out.append(item)
        got.add(item)
        await consumer.ack(msg)


async def test_clients_follow_the_moved_close_frame_without_the_dag(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    env = TopicEnv(operator, [b.url for b in brokers], NS, "moving", subscriptions={"s": "Stream"})
    await env.create(2)
    load = KeyedLoad(KEYS)
    done = asyncio.Event()
    streamed: list[tuple[str, int]] = []
    source = env.placement[0]
    destination = next(u for u in env.broker_urls if u != source)
    try:
        async with (
            ScalableTopicProducer(env.service_url, NS, env.topic, linger_ms=2) as producer,
            StreamConsumer(env.service_url, NS, env.topic, "s", "reader-1") as stream,
        ):
            reader = asyncio.create_task(_read(stream, load, done, streamed))
            sending = asyncio.create_task(load.run(producer, 80, pause=0.01))
            async with asyncio.timeout(60):
                await load.wait_acked(20 * len(KEYS))
            moved_at = await move(env, 0, destination)

            async def written_at_new_owner() -> bool:
                stats = await env.admins[destination].stats(NS, env.topic, 0)
                return int(stats["lastPosition"]) > moved_at

            await eventually(written_at_new_owner, within=30)
            assert env.placement[0] == source, "the DAG still names the old owner"
            assert producer.moves >= 1
            async with SegmentAdmin(destination) as admin:

                async def consumer_at_new_owner() -> bool:
                    stats = await admin.stats(NS, env.topic, 0)
                    return bool(stats["subscriptions"]["s"]["consumers"])

                await eventually(consumer_at_new_owner, within=30)
            env.placement[0] = destination
            env.publish()
            async with asyncio.timeout(120):
                await sending
                await producer.flush()
            done.set()
            async with asyncio.timeout(60):
                await reader
        assert not load.errors
        assert load.sent == len(load.acked) == 80 * len(KEYS)
        check_order(streamed, load.acked)
    finally:
        await env.close()

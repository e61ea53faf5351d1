"""Stream and checkpoint consumers against the real session server and real broker processes:
reassignment when a second consumer joins, checkpoint export/restore, controller failover
(redirect to the new leader), and the blocking wrappers."""

from __future__ import annotations

import asyncio
import logging

import pytest

from scalable_topics.client import (
    Checkpoint,
    CheckpointConsumer,
    ConsumerError,
    MessageId,
    ProducerClosedError,
    QueueConsumer,
    ScalableTopicProducer,
    StreamConsumer,
    SyncConsumer,
    SyncProducer,
)
from scalable_topics.client.consumers import base as consumers_base
from scalable_topics.client.segment import SegmentConsumer
from segment_broker.testing import BrokerProcess

from .client_harness import (
    KeyedLoad,
    OperatorReplica,
    TopicEnv,
    check_order,
    start_operator,
)
from .conftest import eventually

pytestmark = pytest.mark.integration

NS = "clients"
SUBS = {"stream": "Stream", "queue": "Queue"}
KEYS = [f"user-{i}" for i in range(24)]


async def _env(
    operator: OperatorReplica, brokers: list[BrokerProcess], topic: str, segments: int = 2
) -> TopicEnv:
    env = TopicEnv(operator, [b.url for b in brokers], NS, topic, subscriptions=SUBS)
    await env.create(segments)
    return env


async def _produce(env: TopicEnv, load: KeyedLoad, rounds: int, first: int = 0) -> None:
    async with ScalableTopicProducer(env.service_url, NS, env.topic) as producer:
        await load.run(producer, rounds, first=first)
    assert not load.errors


async def _read(
    consumer: StreamConsumer | CheckpointConsumer,
    count: int,
    out: list[tuple[str, int]],
    *,
    ack: bool = True,
    within: float = 30.0,
) -> None:
    async with asyncio.timeout(within):
        for _ in range(count):
            msg = await consumer.receive()
            out.append(KeyedLoad.parse(msg.value))
            if ack and isinstance(consumer, StreamConsumer):
                await consumer.ack(msg)


async def test_second_consumer_takes_half_the_segments(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    env = await _env(operator, brokers, "rebalance", segments=4)
    load = KeyedLoad(KEYS)
    try:
        first = StreamConsumer(env.service_url, NS, env.topic, "stream", "worker-a")
        await first.start()
        assert sorted(first.assignment) == [0, 1, 2, 3]
        await _produce(env, load, 10)
        seen_a: list[tuple[str, int]] = []
        await _read(first, len(KEYS) * 10, seen_a)
        check_order(seen_a, load.acked)

        second = StreamConsumer(env.service_url, NS, env.topic, "stream", "worker-b")
        await second.start()
        await first.wait_assignment(lambda ids: len(ids) == 2, within=10)
        await second.wait_assignment(lambda ids: len(ids) == 2, within=10)
        assert sorted(first.assignment + second.assignment) == [0, 1, 2, 3]

        more = KeyedLoad(KEYS)
        await _produce(env, more, 10, first=10)
        expected = set((k, n) for (k, n) in more.acked)
        got: list[tuple[str, int]] = []
        got_a: list[tuple[str, int]] = []
        got_b: list[tuple[str, int]] = []

        async def drain(consumer: StreamConsumer, out: list[tuple[str, int]]) -> None:
            while not expected <= set(got):
                try:
                    async with asyncio.timeout(0.3):
                        msg = await consumer.receive()
                except TimeoutError:
                    continue
                item = KeyedLoad.parse(msg.value)
                if item[1] < 10 and item in load.acked:
                    continue  # redelivery of the first batch is allowed, not needed
                out.append(item)
                got.append(item)
                await consumer.ack(msg)

        async with asyncio.timeout(30):
            await asyncio.gather(drain(first, got_a), drain(second, got_b))
        assert got_a and got_b, "both consumers must receive messages"
        keys_a = {k for k, _ in got_a}
        keys_b = {k for k, _ in got_b}
        assert not keys_a & keys_b, "a key is read by one consumer only"
        check_order(got_a, {i: None for i in more.acked if i[0] in keys_a})
        check_order(got_b, {i: None for i in more.acked if i[0] in keys_b})
        await second.close(unregister=True)
        await first.wait_assignment(lambda ids: len(ids) == 4, within=10)
        await first.close()
    finally:
        await env.close()


async def test_checkpoint_export_and_restore(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    env = await _env(operator, brokers, "checkpoint")
    load = KeyedLoad(KEYS)
    try:
        await _produce(env, load, 10)
        total = len(KEYS) * 10
        first: list[tuple[str, int]] = []
        consumer = CheckpointConsumer(env.service_url, NS, env.topic, "stream", "etl")
        await consumer.start()
        await _read(consumer, total // 2, first)
        saved = consumer.checkpoint().dumps()
        await consumer.close()

        # A split after the checkpoint: the restored consumer must finish the parent, then
        # read the children.
        children = await env.split(0)
        more = KeyedLoad(KEYS)
        async with ScalableTopicProducer(env.service_url, NS, env.topic) as producer:
            for key in KEYS:
                await producer.send(KeyedLoad.value(key, 10), key=key)
                more.acked[(key, 10)] = None

        checkpoint = Checkpoint.loads(saved)
        assert checkpoint.subscription == "stream"
        restored = CheckpointConsumer(
            env.service_url, NS, env.topic, "stream", "etl", start_from=checkpoint
        )
        await restored.start()
        second: list[tuple[str, int]] = []
        await _read(restored, total - total // 2 + len(KEYS), second)
        assert not set(first) & set(second), "nothing before the checkpoint is read again"
        check_order(first + second, {**load.acked, **more.acked})
        await eventually(lambda: 0 in restored.drained_segments, within=10)
        final = restored.checkpoint()
        assert 0 in final.drained
        assert set(final.positions) <= {1, *children}
        assert Checkpoint.loads(final.dumps()) == final
        await restored.close()
    finally:
        await env.close()


async def test_checkpoint_consumer_asks_again_for_a_seal_its_broker_had_not_made(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    """The DAG can say a segment is sealed before its broker has sealed it. A checkpoint
    consumer reading the whole segment learns where it ends from the broker; one that heard
    "not sealed" asks again, instead of waiting for an event (an entry, a new assignment or
    DAG) that need never come once every entry was delivered."""
    env = await _env(operator, brokers, "seal-race", segments=1)
    load = KeyedLoad(KEYS)
    try:
        await _produce(env, load, 5)
        total = len(KEYS) * 5
        await env.announce_split(0)
        consumer = CheckpointConsumer(env.service_url, NS, env.topic, "stream", "etl")
        await consumer.start()
        got: list[tuple[str, int]] = []
        await _read(consumer, total, got)
        check_order(got, load.acked)
        assert 0 not in consumer.drained_segments, "the broker has not sealed segment 0"

        await env.admins[env.placement[0]].terminate(NS, env.topic, 0)
        await eventually(lambda: 0 in consumer.drained_segments, within=15)
        await consumer.close()
    finally:
        await env.close()


async def test_a_previous_owner_that_does_not_let_go_is_logged(
    operator: OperatorReplica,
    brokers: list[BrokerProcess],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Refusals while a previous owner lets go are a hand-over's usual wait and stay quiet;
    once they last, the consumer's log says which segment waits on whom."""
    monkeypatch.setattr(consumers_base, "REFUSALS_REPORTED_AFTER", 0.5)
    caplog.set_level(logging.INFO, logger="scalable_topics.client")
    env = await _env(operator, brokers, "squatted", segments=1)
    squatter = await SegmentConsumer.connect(
        env.placement[0], NS, env.topic, 0, "stream", "squatter"
    )
    consumer = StreamConsumer(env.service_url, NS, env.topic, "stream", "c1")
    try:
        await consumer.start()
        await eventually(lambda: "attach refused for" in caplog.text, within=15)
        refusal = next(m for r in caplog.records if "refused for" in (m := r.getMessage()))
        assert "segment 0 buckets all" in refusal and "squatter" in refusal, refusal

        await squatter.close()
        await eventually(lambda: "attached after" in caplog.text, within=15)
    finally:
        await squatter.close()
        await consumer.close()
        await env.close()


async def test_consumer_follows_the_controller_to_a_new_leader(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    env = await _env(operator, brokers, "failover")
    standby = await start_operator(dags=None, leader=operator.url)
    env.operators.append(standby)
    load = KeyedLoad(KEYS)
    try:
        # A stale controllerUrl sends the consumer to the standby, which answers 307.
        env.controller_url = standby.url
        env.publish()
        consumer = StreamConsumer(standby.url, NS, env.topic, "stream", "worker-a")
        await consumer.start()
        assert sorted(consumer.assignment) == [0, 1]
        assert consumer.controller_sessions == 1
        leader = operator.hub.coordinator(NS, env.topic, "stream")
        assert leader is not None and leader.connected() == ["worker-a"]

        # Leadership moves to the standby: the old leader redirects its consumers.
        operator.routing.leader = standby.url
        standby.routing.leader = standby.url
        standby.hub.restore(
            NS,
            env.topic,
            env.layout,
            [operator.persisted[(NS, env.topic, "stream")]],
            grace_period=30.0,
            strategies={"stream": "sticky"},
        )
        operator.hub.forget_topic(NS, env.topic)

        def moved() -> bool:
            coordinator = standby.hub.coordinator(NS, env.topic, "stream")
            return coordinator is not None and coordinator.connected() == ["worker-a"]

        await eventually(moved, within=10)
        assert consumer.controller_sessions >= 2

        await _produce(env, load, 5)
        got: list[tuple[str, int]] = []
        await _read(consumer, len(KEYS) * 5, got)
        check_order(got, load.acked)

        # The same name registering again elsewhere supersedes this session.
        other = StreamConsumer(standby.url, NS, env.topic, "stream", "worker-a")
        await other.start()
        with pytest.raises(ConsumerError):
            async with asyncio.timeout(10):
                await consumer.receive()
        await other.close()
        await consumer.close()
    finally:
        await standby.stop()
        await env.close()


async def test_blocking_wrappers(operator: OperatorReplica, brokers: list[BrokerProcess]) -> None:
    env = await _env(operator, brokers, "sync")
    try:

        def work() -> list[tuple[str | None, bytes]]:
            with SyncProducer(env.service_url, NS, env.topic) as producer:
                ids = [producer.send(f"v{i}".encode(), key=f"k{i % 3}") for i in range(9)]
                assert len({(m.segment_id, m.position, m.batch_index) for m in ids}) == 9
                unkeyed = [producer.send_async(f"u{i}".encode()) for i in range(4)]
                spread = {f.result(timeout=20).segment_id for f in unkeyed}
                assert spread == {0, 1}, "unkeyed messages go round-robin"
                many = producer.send_many([b"m0", b"m1"], ["k0", "k1"])
                assert len(many) == 2 and many[0] != many[1]
            with SyncConsumer.for_stream(
                env.service_url, NS, env.topic, "stream", "sync-reader"
            ) as consumer:
                out = []
                for _ in range(5):
                    msg = consumer.receive(timeout=20)
                    consumer.ack(msg)
                    out.append((msg.key, msg.value))
                while len(out) < 15:
                    batch = consumer.receive_many(4, timeout=20)
                    assert 1 <= len(batch) <= 4
                    consumer.ack_many(batch)
                    out += [(msg.key, msg.value) for msg in batch]
            return out

        received = await asyncio.to_thread(work)
        assert sorted(v for _, v in received) == sorted(
            [f"v{i}".encode() for i in range(9)]
            + [f"u{i}".encode() for i in range(4)]
            + [b"m0", b"m1"]
        )
        assert all(k is None for k, v in received if v.startswith(b"u"))
        for key in ("k0", "k1", "k2"):
            values = [int(v[1:]) for k, v in received if k == key and v.startswith(b"v")]
            assert len(values) == 3
            assert values == sorted(values)
    finally:
        await env.close()


async def _first_value(consumer: StreamConsumer | QueueConsumer) -> bytes:
    """The first value a fresh consumer of an acknowledged subscription receives: the marker
    sent after the acknowledgements, unless something acknowledged is delivered again."""
    async with consumer, asyncio.timeout(30):
        return (await consumer.receive()).value


async def test_send_many_receive_many_and_ack_many(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    env = await _env(operator, brokers, "batches")
    try:
        count = 300
        values = [b"%d" % i for i in range(count)]
        keys: list[str | bytes | None] = [KEYS[i % len(KEYS)] for i in range(count)]
        async with ScalableTopicProducer(env.service_url, NS, env.topic, max_pending=50) as p:
            with pytest.raises(ValueError, match="300 values but 2 keys"):
                await p.send_many(values, keys[:2])
            assert await (await p.send_many([])) == []
            # a batch six times max_pending waits for room message by message
            batch = await p.send_many(values[:150], keys[:150])
            single = await p.send_async(b"single", "user-0")
            rest = await p.send_many(values[150:], keys[150:])
            unkeyed = await p.send_many([b"u0", b"u1", b"u2", b"u3"])
            ids = await batch + await rest
            assert len(ids) == count and all(isinstance(i, MessageId) for i in ids)
            assert len(set(ids)) == count
            for key in KEYS:
                of_key = [i for i, k in zip(ids, keys, strict=True) if k == key]
                assert of_key == sorted(of_key), f"{key}: stored out of send order"
                assert len({i.segment_id for i in of_key}) == 1
            # user-0 is keys[144] in the first batch and keys[168] in the second
            assert ids[144] < await single < ids[168], "send order across calls"
            assert {i.segment_id for i in await unkeyed} == {0, 1}
        with pytest.raises(ProducerClosedError):
            await p.send_many([b"late"])

        stream = StreamConsumer(env.service_url, NS, env.topic, "stream", "batch-reader")
        queue = QueueConsumer(env.service_url, NS, env.topic, "queue", "batch-worker")
        for consumer in (stream, queue):
            got: list[bytes] = []
            async with consumer, asyncio.timeout(30):
                with pytest.raises(ValueError):
                    await consumer.receive_many(0)
                while len(got) < count + 5:
                    messages = await consumer.receive_many(64)
                    assert 1 <= len(messages) <= 64
                    got += [m.value for m in messages]
                    consumer.ack_many(messages)
            assert sorted(got) == sorted([*values, b"single", b"u0", b"u1", b"u2", b"u3"])
            if consumer is stream:
                by_key: dict[str, list[int]] = {}
                for value in got:
                    if value.isdigit():
                        by_key.setdefault(KEYS[int(value) % len(KEYS)], []).append(int(value))
                assert all(v == sorted(v) for v in by_key.values()), "per-key order broken"

        async with ScalableTopicProducer(env.service_url, NS, env.topic) as p:
            await (await p.send_many([b"marker"], ["user-1"]))
        again = StreamConsumer(env.service_url, NS, env.topic, "stream", "batch-reader")
        assert await _first_value(again) == b"marker", "ack_many lost an ack"
        worker = QueueConsumer(env.service_url, NS, env.topic, "queue", "batch-worker")
        assert await _first_value(worker) == b"marker", "ack_many lost an ack"
    finally:
        await env.close()

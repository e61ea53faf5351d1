"""Leaving, in every state, against the real session server and real broker processes
(``client_harness``): a producer's close and its cancellation (Ctrl-C) while it retries an
unreachable broker, waits for the DAG or waits for a hung broker's acknowledgements; a producer
and consumers whose topic is deleted under them; and a consumer's clean close, which hands what
it held to the others at once instead of after the grace period."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest

from scalable_topics.client import (
    CheckpointConsumer,
    ConsumerError,
    ProducerClosedError,
    QueueConsumer,
    ScalableTopicProducer,
    StreamConsumer,
    SyncConsumer,
    SyncProducer,
    TopicNotFoundError,
)
from scalable_topics.core.layout import SegmentLayout
from scalable_topics.core.sessions import dag_message
from segment_broker.testing import BrokerProcess, free_port

from .client_harness import KeyedLoad, OperatorReplica, TopicEnv, check_order
from .conftest import eventually

pytestmark = pytest.mark.integration

NS = "leaving"
SUBS = {"stream": "Stream", "queue": "Queue"}
KEYS = [f"acct-{i}" for i in range(12)]
CLOSE_BOUND = 2.0
"""What the SDK promises for close() of a stuck producer and for Ctrl-C (docs/client.md)."""
GRACE = 60.0
"""The default grace period: a hand-off that waited for it could not meet the deadlines here."""
HAND_OFF_WITHIN = 5.0


async def _elapsed(action: Awaitable[Any]) -> float:
    started = time.monotonic()
    await action
    return time.monotonic() - started


async def _cancelled_after(task: asyncio.Task[Any]) -> float:
    """Cancel ``task`` (what Ctrl-C does to ``asyncio.run``'s main task) and time its end."""
    started = time.monotonic()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return time.monotonic() - started


def _publish_one_segment(operator: OperatorReplica, topic: str, brokers: dict[int, str]) -> None:
    """A one-segment topic whose segment is at ``brokers`` (``{}``: not placed yet)."""
    operator.dags.publish(
        dag_message(
            NS,
            topic,
            SegmentLayout.initial(1),
            brokers=brokers,
            buckets={0: 1},
            controller_url=None,
        )
    )


def _nowhere(operator: OperatorReplica, topic: str, placement: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    _publish_one_segment(operator, topic, {0: dead} if placement == "unreachable" else {})


async def _retrying(producer: ScalableTopicProducer, future: asyncio.Future[Any]) -> None:
    """Let the producer fail a few connection attempts (or DAG waits) for ``future``."""
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        assert not future.done() and producer.connections == 0
        await asyncio.sleep(0.05)


# -- a producer that cannot deliver ------------------------------------------------------------


@pytest.mark.parametrize("placement", ["unreachable", "unplaced"])
async def test_close_does_not_wait_for_a_reconnect(
    operator: OperatorReplica, placement: str
) -> None:
    """Retrying a refused connection, or waiting for the DAG to place the segment: close()
    returns at once and the message fails with ProducerClosedError."""
    topic = f"close-{placement}"
    _nowhere(operator, topic, placement)
    producer = await ScalableTopicProducer(operator.url, NS, topic).start()
    future = await producer.send_async(b"never", key="k")
    await _retrying(producer, future)
    assert await _elapsed(producer.close()) < CLOSE_BOUND
    with pytest.raises(ProducerClosedError):
        await future


@pytest.mark.parametrize("placement", ["unreachable", "unplaced"])
async def test_ctrl_c_while_retrying(operator: OperatorReplica, placement: str) -> None:
    topic = f"cancel-{placement}"
    _nowhere(operator, topic, placement)
    entered = asyncio.Event()

    async def command() -> None:
        async with ScalableTopicProducer(operator.url, NS, topic) as producer:
            entered.set()
            await producer.send(b"blocked", key="k")

    task = asyncio.create_task(command())
    await asyncio.wait_for(entered.wait(), 10)
    await asyncio.sleep(0.3)
    assert not task.done()
    assert await _cancelled_after(task) < CLOSE_BOUND


async def test_keyboard_interrupt_in_the_blocking_producer(operator: OperatorReplica) -> None:
    _nowhere(operator, "sync-interrupted", "unreachable")

    def script() -> float:
        try:
            with SyncProducer(operator.url, NS, "sync-interrupted") as producer:
                producer.send_async(b"never", key="k")
                with pytest.raises(TimeoutError):
                    producer.send(b"blocked", key="k", timeout=0.3)
                interrupted = time.monotonic()
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            return time.monotonic() - interrupted

    assert await asyncio.to_thread(script) < CLOSE_BOUND


@contextlib.asynccontextmanager
async def _own_broker(tmp_path: Path, operator: OperatorReplica) -> AsyncIterator[BrokerProcess]:
    """A one-segment topic "hung" on a broker of its own (continued and killed on exit)."""
    data = tmp_path / "own-broker"
    data.mkdir()
    broker = BrokerProcess(data)
    broker.start()
    env = TopicEnv(operator, [broker.url], NS, "hung", subscriptions={"stream": "Stream"})
    try:
        await broker.wait_ready()
        await env.create(1)
        yield broker
    finally:
        _signal(broker, signal.SIGCONT)
        broker.kill()
        await env.close()


def _signal(broker: BrokerProcess, sig: signal.Signals) -> None:
    assert broker.proc is not None
    os.kill(broker.proc.pid, sig)


async def test_ctrl_c_and_close_while_a_hung_broker_holds_the_acks(
    tmp_path: Path, operator: OperatorReplica
) -> None:
    async with _own_broker(tmp_path, operator) as broker:
        waiting = asyncio.Event()

        async def command() -> None:
            async with ScalableTopicProducer(operator.url, NS, "hung") as producer:
                await producer.send(b"first", key="k")
                _signal(broker, signal.SIGSTOP)
                waiting.set()
                await producer.send(b"second", key="k")

        task = asyncio.create_task(command())
        await asyncio.wait_for(waiting.wait(), 20)
        await asyncio.sleep(0.3)
        assert not task.done()
        assert await _cancelled_after(task) < CLOSE_BOUND

        # close(within=) waits that long for acknowledgements that may still come, no longer.
        _signal(broker, signal.SIGCONT)
        producer = await ScalableTopicProducer(operator.url, NS, "hung").start()
        await producer.send(b"third", key="k")
        _signal(broker, signal.SIGSTOP)
        future = await producer.send_async(b"fourth", key="k")
        assert 0.5 <= await _elapsed(producer.close(within=0.5)) < 0.5 + CLOSE_BOUND
        with pytest.raises(ProducerClosedError):
            await future


# -- the topic deleted under its clients -------------------------------------------------------


async def _delete_topic(env: TopicEnv) -> None:
    """What the operator does: its finalizer deletes the segments on the brokers, then the
    topic leaves its cache (the DAG watches end) and the consumer hub (UnknownTopic)."""
    for segment_id, url in env.placement.items():
        await env.admins[url].delete_segment(NS, env.topic, segment_id)
    env.operator.dags.delete(NS, env.topic)
    env.operator.hub.forget_topic(NS, env.topic)


async def test_a_deleted_topic_fails_its_producer_and_consumers_alike(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    env = TopicEnv(operator, [b.url for b in brokers], NS, "deleted", subscriptions=SUBS)
    await env.create(2)
    producer = await ScalableTopicProducer(env.service_url, NS, env.topic).start()
    stream = StreamConsumer(env.service_url, NS, env.topic, "stream", "reader")
    unordered = QueueConsumer(env.service_url, NS, env.topic, "queue", "any", ordered=False)
    try:
        await stream.start()
        await unordered.start()
        for key in KEYS:
            await producer.send(b"before", key=key)
        pending = [await producer.send_async(b"lost?", key=key) for key in KEYS]

        deleted = time.monotonic()
        await _delete_topic(env)
        with pytest.raises(TopicNotFoundError) as sent:
            async with asyncio.timeout(CLOSE_BOUND):
                while True:
                    await producer.send(b"after", key="acct-1")
        failed_after = time.monotonic() - deleted
        assert str(sent.value) == f"topic {NS}/{env.topic} was deleted"
        for future in pending:
            with contextlib.suppress(TopicNotFoundError):
                await future  # stored before the deletion, or failed with the same error
        with pytest.raises(TopicNotFoundError):
            await producer.send_async(b"later", key="acct-2")

        for consumer in (stream, unordered):
            with pytest.raises(TopicNotFoundError) as received:
                async with asyncio.timeout(CLOSE_BOUND):
                    while True:
                        await consumer.receive()
            assert isinstance(received.value, ConsumerError)
            assert str(received.value) == str(sent.value)
        assert failed_after < CLOSE_BOUND
        assert await _elapsed(producer.close()) < CLOSE_BOUND
    finally:
        await producer.close()
        await stream.close()
        await unordered.close()
        await env.close()


# -- a consumer's clean close ------------------------------------------------------------------


async def _env(operator: OperatorReplica, brokers: list[BrokerProcess], topic: str) -> TopicEnv:
    env = TopicEnv(
        operator, [b.url for b in brokers], NS, topic, subscriptions=SUBS, grace_period=GRACE
    )
    await env.create(2)
    return env


async def _produce(env: TopicEnv, rounds: int) -> KeyedLoad:
    load = KeyedLoad(KEYS)
    async with ScalableTopicProducer(env.service_url, NS, env.topic) as producer:
        await load.run(producer, rounds)
    assert not load.errors
    return load


async def _read(consumer: Any, out: list[tuple[str, int]], until: int) -> None:
    while len(out) < until:
        message = await consumer.receive()
        out.append(KeyedLoad.parse(message.value))
        if not isinstance(consumer, CheckpointConsumer):
            await consumer.ack(message)


@pytest.mark.parametrize("kind", ["stream", "checkpoint", "queue"])
async def test_a_clean_close_hands_everything_over_at_once(
    operator: OperatorReplica, brokers: list[BrokerProcess], kind: str
) -> None:
    """A closes cleanly mid-stream; B, started right after, holds every segment (every bucket)
    within seconds although the grace period is a minute, and reads the rest in key order."""
    env = await _env(operator, brokers, f"handoff-{kind}")
    sub = "queue" if kind == "queue" else "stream"
    make = {"stream": StreamConsumer, "checkpoint": CheckpointConsumer, "queue": QueueConsumer}[
        kind
    ]
    first = make(env.service_url, NS, env.topic, sub, "a")
    second = make(env.service_url, NS, env.topic, sub, "b")
    try:
        load = await _produce(env, 10)
        await first.start()
        assert sorted(first.assignment) == [0, 1]
        got: list[tuple[str, int]] = []
        async with asyncio.timeout(30):
            await _read(first, got, len(load.acked) // 2)
        await first.close()

        started = time.monotonic()
        await second.start()
        await second.wait_assignment(lambda ids: sorted(ids) == [0, 1], within=HAND_OFF_WITHIN)
        if isinstance(second, QueueConsumer):
            assert second.buckets == {0: (0, 1), 1: (0, 1)}
        coordinator = operator.hub.coordinator(NS, env.topic, sub)
        assert coordinator is not None and list(coordinator.sessions()) == ["b"]

        def persisted() -> list[str]:
            status = operator.persisted[(NS, env.topic, sub)]
            return [str(c["name"]) for c in status["consumers"]]

        await eventually(lambda: persisted() == ["b"], within=HAND_OFF_WITHIN)
        rest: list[tuple[str, int]] = []
        async with asyncio.timeout(HAND_OFF_WITHIN):
            while not set(load.acked) <= set(got) | set(rest):
                message = await second.receive()
                rest.append(KeyedLoad.parse(message.value))
                if not isinstance(second, CheckpointConsumer):
                    await second.ack(message)
        assert time.monotonic() - started < HAND_OFF_WITHIN
        if kind != "checkpoint":  # without a stored checkpoint, B reads from the start
            check_order(got + rest, load.acked)
    finally:
        await second.close()
        await first.close()
        await env.close()


async def test_the_blocking_consumer_example_after_another_closed(
    operator: OperatorReplica, brokers: list[BrokerProcess]
) -> None:
    """docs/client.md's SyncConsumer example, run twice under two names right one after the
    other: the second gets the messages the first did not take."""
    env = await _env(operator, brokers, "sync-handoff")

    def scripts() -> list[bytes]:
        with SyncProducer(env.service_url, NS, env.topic) as producer:
            for i in range(4):
                producer.send(b"m%d" % i, key="one-key")
        values = []
        for name in ("script-1", "script-2"):
            with SyncConsumer.for_stream(
                env.service_url, NS, env.topic, "stream", name
            ) as consumer:
                msg = consumer.receive(timeout=HAND_OFF_WITHIN)
                consumer.ack(msg)
                values.append(msg.value)
        return values

    try:
        assert await asyncio.to_thread(scripts) == [b"m0", b"m1"]
    finally:
        await env.close()

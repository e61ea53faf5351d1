"""Clients leaving, against the whole stack: the real operator process (its consumer hub
persisting registrations in the topic's status, its topic cache ending DAG watches on
deletion, its finalizer deleting the segments) and real broker pods on the embedded control
plane (``operator_harness``).

* A consumer that closes cleanly hands its segments over at once, with the default grace period
  of 60 s: docs/client.md's ``SyncConsumer`` example run by two scripts one after the other, and
  an asyncio consumer followed by another; the registration's removal is persisted.
* ``kubectl delete`` of a topic in use fails its producer and its consumer with the same
  ``TopicNotFoundError`` right when the deletion completes, and the producer's close is quick.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio

from scalable_topics.client import (
    ConsumerError,
    DagWatcher,
    ScalableTopicProducer,
    StreamConsumer,
    SyncConsumer,
    SyncProducer,
    TopicNotFoundError,
)
from tests.chaos.scenario import service_url

from .operator_harness import Stack, eventually, operator_stack, topic_body

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

SUB = "billing"
HAND_OFF_WITHIN = 5.0
"""Far below the default grace period (60 s) that a hand-off after a clean close must not wait."""
CLOSE_BOUND = 2.0


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    async with operator_stack(
        tmp_path_factory.mktemp("leave"), operator_replicas=1, brokers=2
    ) as running:
        yield running


async def _topic(stack: Stack, name: str) -> str:
    """A two-segment topic with the default grace period, placed; the clients' URL."""
    await stack.apply_topic(topic_body(name, segments=2, autoScale={"enabled": False}))
    await stack.wait_ready(name, 90)
    url = await service_url(stack)
    async with DagWatcher(url, "default", name) as watcher:
        await watcher.wait_for(
            lambda d: len(d.brokers()) == len(d.segments) == 2 and d.controller_url is not None,
            within=60,
        )
    return url


async def _registered(stack: Stack, name: str) -> list[str] | None:
    topic = await stack.topic(name)
    for entry in ((topic or {}).get("status") or {}).get("subscriptions") or []:
        if entry.get("name") == SUB:
            return sorted(str(c["name"]) for c in entry.get("consumers") or [])
    return None


async def test_a_clean_close_hands_the_segments_over_at_once(stack: Stack) -> None:
    name = "handoff"
    url = await _topic(stack, name)

    def scripts() -> list[bytes]:
        """docs/client.md's blocking example, once per script name."""
        with SyncProducer(url, "default", name) as producer:
            for i in range(4):
                producer.send(b"m%d" % i, key="one-key")
        values = []
        for script in ("script-1", "script-2"):
            with SyncConsumer.for_stream(url, "default", name, SUB, script) as consumer:
                msg = consumer.receive(timeout=HAND_OFF_WITHIN)
                consumer.ack(msg)
                values.append(msg.value)
        return values

    assert await asyncio.to_thread(scripts) == [b"m0", b"m1"]

    first = StreamConsumer(url, "default", name, SUB, "worker-a")
    second = StreamConsumer(url, "default", name, SUB, "worker-b")
    try:
        await first.start()
        await first.wait_assignment(lambda ids: sorted(ids) == [0, 1], within=10)

        async def only_a() -> bool:
            return await _registered(stack, name) == ["worker-a"]

        await eventually(only_a, 30, "worker-a alone in the status")
        await first.close()
        started = time.monotonic()
        await second.start()
        await second.wait_assignment(lambda ids: sorted(ids) == [0, 1], within=HAND_OFF_WITHIN)
        msg = await asyncio.wait_for(second.receive(), HAND_OFF_WITHIN)
        assert msg.value == b"m2", "the next unacknowledged message"
        assert time.monotonic() - started < HAND_OFF_WITHIN

        async def only_b() -> bool:
            return await _registered(stack, name) == ["worker-b"]

        await eventually(only_b, 30, "worker-a's removal persisted")
    finally:
        await second.close()
        await first.close()


async def test_deleting_a_topic_fails_its_producer_and_consumer_alike(stack: Stack) -> None:
    name = "doomed-in-use"
    url = await _topic(stack, name)
    producer = await ScalableTopicProducer(url, "default", name).start()
    consumer = StreamConsumer(url, "default", name, SUB, "reader")
    failures: dict[str, tuple[float, BaseException]] = {}
    stored: list[int] = []

    async def produce() -> None:
        try:
            for i in range(1_000_000):
                await producer.send(b"%d" % i, key=f"k{i % 8}")
                stored.append(i)
                await asyncio.sleep(0.01)
        except Exception as exc:
            failures["producer"] = (time.monotonic(), exc)

    async def consume() -> None:
        try:
            while True:
                await consumer.ack(await consumer.receive())
        except Exception as exc:
            failures["consumer"] = (time.monotonic(), exc)

    tasks: list[asyncio.Task[Any]] = []
    try:
        await consumer.start()
        tasks = [asyncio.create_task(produce()), asyncio.create_task(consume())]
        await eventually(_flowing(stored), 30, "messages flowing")
        await stack.kubectl("delete", "stopic", name, "--wait=false")

        async def gone() -> bool:
            return await stack.topic(name) is None

        await eventually(gone, 60, "the deletion completed")
        deleted = time.monotonic()
        async with asyncio.timeout(CLOSE_BOUND + 1):
            await asyncio.gather(*tasks)
        sent_at, sent = failures["producer"]
        received_at, received = failures["consumer"]
        assert isinstance(sent, TopicNotFoundError), repr(sent)
        assert isinstance(received, TopicNotFoundError) and isinstance(received, ConsumerError)
        assert str(sent) == str(received) == f"topic default/{name} was deleted"
        assert max(sent_at, received_at) - deleted < CLOSE_BOUND
        with pytest.raises(TopicNotFoundError):
            await producer.send(b"after", key="k0")
        started = time.monotonic()
        await producer.close()
        assert time.monotonic() - started < CLOSE_BOUND
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await producer.close()
        await consumer.close()


def _flowing(stored: list[int]) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return len(stored) >= 50

    return probe

"""The producer survives a broker that is SIGKILLed and restarted: it reconnects, resends its
unacknowledged entries with the same sequence ids, and the broker's deduplication leaves every
message in the log exactly once, in key order."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from scalable_topics.client import ScalableTopicProducer, StreamConsumer
from segment_broker.testing import BrokerProcess

from .client_harness import KeyedLoad, OperatorReplica, TopicEnv, check_order

pytestmark = pytest.mark.integration

NS = "clients"
KEYS = [f"acct-{i}" for i in range(16)]


async def test_producer_survives_broker_restart_without_duplicates(
    operator: OperatorReplica, tmp_path: Path
) -> None:
    data = tmp_path / "broker"
    data.mkdir()
    broker = BrokerProcess(data)
    broker.start()
    env = TopicEnv(operator, [broker.url], NS, "restart", subscriptions={"stream": "Stream"})
    try:
        await broker.wait_ready()
        await env.create(1)
        load = KeyedLoad(KEYS)
        rounds = 150
        async with ScalableTopicProducer(
            env.service_url, NS, env.topic, name="restart-producer", linger_ms=1
        ) as producer:
            sending = asyncio.create_task(load.run(producer, rounds, window=400))
            async with asyncio.timeout(30):
                await load.wait_acked(20 * len(KEYS))
            broker.kill()
            assert not sending.done()
            broker.start()
            await broker.wait_ready()
            async with asyncio.timeout(60):
                await sending
            await producer.flush()
            assert producer.connections >= 2
            assert producer.resent_entries > 0, "the kill left nothing unacknowledged"
        assert not load.errors
        assert len(load.acked) == rounds * len(KEYS)

        received: list[tuple[str, int]] = []
        async with StreamConsumer(env.service_url, NS, env.topic, "stream", "auditor") as reader:
            async with asyncio.timeout(30):
                while len(received) < rounds * len(KEYS):
                    msg = await reader.receive()
                    received.append(KeyedLoad.parse(msg.value))
                    await reader.ack(msg)
        counts = Counter(received)
        assert max(counts.values()) == 1, "the broker stored a message twice"
        check_order(received, load.acked)
        stats = await env.stats(0)
        assert stats["lastPosition"] + 1 == len(
            {(m.segment_id, m.position) for m in load.acked.values()}
        )
    finally:
        broker.kill()
        await env.close()

"""A corrupted segment on the full stack (issue 11, part 2): the broker pod writes
``Segment.status.corruption``, the operator turns it into ``Ready=False``/``Stalled=True``
with reason ``SegmentCorrupted`` and a Warning event on the topic, the SDK's producer fails
the messages for that segment at once while the other segment takes writes, and the admin
truncate brings everything back to Ready.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from scalable_topics.client import ScalableTopicProducer, SegmentCorruptedError, StreamConsumer
from scalable_topics.client.segment import SegmentAdmin, SegmentProducer
from scalable_topics.core.hashing import segment_hash
from scalable_topics.core.wire import Message
from scalable_topics.localcluster.restclient import PODS
from segment_broker.storage.log import RECORD_HEADER_SIZE, scan_records
from tests.chaos.nemesis import _container, _pid
from tests.chaos.scenario import service_url

from .conftest import metric_samples
from .operator_harness import (
    NAMESPACE,
    JsonObj,
    condition_of,
    eventually,
    operator_stack,
    topic_body,
)

pytestmark = pytest.mark.integration

TOPIC = "ledger"
BAD = 40


def _key_in(low: int, high: int) -> str:
    return next(k for i in range(10_000) if low <= segment_hash(k := f"key-{i}") <= high)


async def test_a_corrupted_segment_makes_the_topic_stalled_until_it_is_truncated(
    tmp_path: Path,
) -> None:
    async with operator_stack(tmp_path, operator_replicas=1, brokers=1) as stack:
        await stack.apply_topic(topic_body(TOPIC, segments=2))
        await stack.wait_ready(TOPIC, within=90)
        segments = await stack.segments(TOPIC)
        broker_url = segments[0]["status"]["broker"]["url"]
        pod_name = segments[0]["status"]["broker"]["pod"]
        producer = await SegmentProducer.connect(broker_url, "default", TOPIC, 0, "seed")
        futures = [await producer.send_entry([Message(b"m%d" % i)]) for i in range(80)]
        assert [a.position for a in await asyncio.gather(*futures)] == list(range(80))
        await producer.close()

        (log_file,) = stack.data_dir.rglob(f"default/{TOPIC}/0000-7fff-0/log-*.log")
        offsets = {pos: off for pos, off, _ in scan_records(log_file.read_bytes())}
        raw = bytearray(log_file.read_bytes())
        raw[offsets[BAD] + RECORD_HEADER_SIZE + 3] ^= 0x04
        log_file.write_bytes(bytes(raw))

        # Crash the broker; the kubelet restarts it and recovery finds the damage.
        pod = await stack.api.get_or_none(PODS, NAMESPACE, pod_name)
        assert pod is not None
        restarts = int(_container(pod).get("restartCount") or 0)
        os.kill(_pid(pod), signal.SIGKILL)

        async def restarted() -> bool:
            current = await stack.api.get_or_none(PODS, NAMESPACE, pod_name)
            return (
                current is not None
                and int(_container(current).get("restartCount") or 0) > restarts
                and (condition_of(current, "Ready") or {}).get("status") == "True"
            )

        await eventually(restarted, 90, "the broker restarted and Ready")

        async def reported() -> JsonObj | None:
            segment = (await stack.segments(TOPIC)).get(0) or {}
            found = (segment.get("status") or {}).get("corruption")
            return found if isinstance(found, dict) else None

        corruption = await eventually(reported, 60, "Segment.status.corruption")
        assert corruption["position"] == BAD
        assert corruption["file"] == log_file.name
        assert corruption["offset"] == offsets[BAD]
        assert corruption["source"] == "recovery"
        assert corruption["reason"] == "checksum mismatch; intact records follow it"
        assert corruption["detectedAt"].endswith("Z")
        assert (await stack.segments(TOPIC))[1]["status"].get("corruption") is None

        async def stalled() -> JsonObj | None:
            topic = await stack.topic(TOPIC)
            ready = condition_of(topic, "Ready") or {}
            return topic if ready.get("reason") == "SegmentCorrupted" else None

        topic = await eventually(stalled, 60, "Ready=False SegmentCorrupted")
        ready = condition_of(topic, "Ready")
        assert ready is not None and ready["status"] == "False"
        assert f"{TOPIC}-0 at position {BAD}" in ready["message"]
        stalled_condition = condition_of(topic, "Stalled")
        assert stalled_condition is not None
        assert (stalled_condition["status"], stalled_condition["reason"]) == (
            "True",
            "SegmentCorrupted",
        )

        async def warned() -> list[JsonObj]:
            return [
                e
                for e in await stack.events(TOPIC)
                if e.get("reason") == "SegmentCorrupted" and e.get("type") == "Warning"
            ]

        (event,) = await eventually(warned, 30, "a SegmentCorrupted Warning event")
        assert f"position {BAD}" in event["message"]

        # The SDK: a stream consumer gets what comes before the damage and then waits, reattaching
        # slowly; a message for the quarantined segment fails at once, the other one is stored.
        url = await service_url(stack)
        async with (
            StreamConsumer(url, "default", TOPIC, "billing", "reader") as reader,
            ScalableTopicProducer(url, "default", TOPIC, linger_ms=0) as sdk,
        ):
            before: list[int] = []
            async with asyncio.timeout(60):
                while len(before) < BAD:
                    message = await reader.receive()
                    assert message.segment_id == 0
                    before.append(message.position)
                    await reader.ack(message)
            assert before == list(range(BAD))
            attaches = await consumer_attaches(broker_url)
            await asyncio.sleep(3.0)  # a window to count reattachments in, not a wait for a state
            assert await consumer_attaches(broker_url) - attaches <= 10, "no reattach storm"

            with pytest.raises(SegmentCorruptedError) as refused:
                async with asyncio.timeout(15):
                    await sdk.send(b"lost?", key=_key_in(0, 0x7FFF))
            assert refused.value.position == BAD
            stored = await sdk.send(b"kept", key=_key_in(0x8000, 0xFFFF))
            assert stored.segment_id == 1

            async with SegmentAdmin(broker_url) as admin:
                done = await admin.truncate("default", TOPIC, 0, BAD, f"default/{TOPIC}/0")
            assert done["corruption"] is None

            async def cleared() -> bool:
                return await reported() is None

            await eventually(cleared, 60, "status.corruption removed")
            topic = await stack.wait_ready(TOPIC, within=60)
            assert (condition_of(topic, "Stalled") or {}).get("status") == "False"
            again = await sdk.send(b"after", key=_key_in(0, 0x7FFF))
            assert (again.segment_id, again.position) == (0, BAD)
            async with asyncio.timeout(60):
                message = await reader.receive()
                while message.segment_id != 0:  # "kept", on the other segment
                    message = await reader.receive()
            assert (message.position, message.value) == (BAD, b"after")


async def consumer_attaches(broker_url: str) -> float:
    """``segment_broker_connections_total{role="consumer"}`` of the broker."""
    samples = await metric_samples(broker_url)
    return samples.get(("segment_broker_connections_total", (("role", "consumer"),)), 0.0)

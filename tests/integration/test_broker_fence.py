"""Fenced segments against real brokers: a produce handshake on a child is held until the
controller activates it, or its parent's seal opens it (or refused with a retriable
SegmentNotWritable), the fence and the activation survive SIGKILL, and bad create bodies are
rejected."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from scalable_topics.client.segment import (
    AdminError,
    SegmentAdmin,
    SegmentNotWritableError,
    SegmentProducer,
    Successor,
)
from scalable_topics.core.wire import Message
from scalable_topics.transferadmin import TransferAdmin
from segment_broker.testing import BrokerProcess, running_broker

pytestmark = pytest.mark.integration

NS, TOPIC = "team-a", "orders"


async def _metric(url: str, line_prefix: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith(line_prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _until(check: Callable[[], Awaitable[bool]], within: float = 15.0) -> None:
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110 - a condition observed over HTTP
            await asyncio.sleep(0.02)


async def test_handshake_is_held_until_activation_and_fence_survives_sigkill(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess(tmp_path / "data", args=["--fence-wait-s", "60"])
    broker.start()
    try:
        await broker.wait_ready()
        async with SegmentAdmin(broker.url) as admin:
            created = await admin.create_segment(NS, TOPIC, 1, 0, 0x7FFF, writable=False)
            assert created["writable"] is False
            again = await admin.create_segment(NS, TOPIC, 1, 0, 0x7FFF)
            assert again["writable"] is False, "a create never lifts an existing fence"

        broker.kill()
        broker.start()
        await broker.wait_ready()
        async with SegmentAdmin(broker.url) as admin:
            assert (await admin.stats(NS, TOPIC, 1))["writable"] is False

            connect = asyncio.create_task(SegmentProducer.connect(broker.url, NS, TOPIC, 1, "p"))

            async def handshake_held() -> bool:
                accepted = 'segment_broker_connections_total{role="producer"}'
                return await _metric(broker.url, accepted) >= 1 and not connect.done()

            await _until(handshake_held)
            assert not connect.done()
            summary = await admin.activate(NS, TOPIC, 1)
            assert summary["writable"] is True
            async with asyncio.timeout(15):
                producer = await connect
            ack = await (await producer.send_entry([Message(b"first", key=b"k")]))
            assert ack.position == 0
            await producer.close()
            opened = 'segment_broker_fenced_handshakes_total{outcome="opened"}'
            assert await _metric(broker.url, opened) == 1

        broker.kill()
        broker.start()
        await broker.wait_ready()
        async with SegmentAdmin(broker.url) as admin:
            stats = await admin.stats(NS, TOPIC, 1)
            assert stats["writable"] is True, "activation is durable"
            assert stats["lastPosition"] == 0
    finally:
        broker.kill()


async def test_handshake_refused_when_not_activated_in_time(tmp_path: Path) -> None:
    async with (
        running_broker(tmp_path / "data", fence_wait_s=0.2) as rb,
        SegmentAdmin(rb.url) as admin,
    ):
        await admin.create_segment(NS, TOPIC, 2, 0, 0xFFFF, writable=False)
        with pytest.raises(SegmentNotWritableError):
            await SegmentProducer.connect(rb.url, NS, TOPIC, 2, "p")
        refused = 'segment_broker_fenced_handshakes_total{outcome="refused"}'
        assert await _metric(rb.url, refused) == 1
        assert (await admin.stats(NS, TOPIC, 2))["counters"]["entriesIn"] == 0

        with pytest.raises(AdminError) as bad:
            await admin._call(
                "PUT",
                f"/{NS}/{TOPIC}/3",
                {"range": {"start": 0, "end": 1}, "writable": "no"},
            )
        assert bad.value.code == "BadRequest"
        assert "writable" in bad.value.message
        with pytest.raises(AdminError) as missing:
            await admin.activate(NS, TOPIC, 9)
        assert missing.value.code in ("NotFound", "SegmentNotFound")


async def test_a_seal_opens_the_successors_it_names_on_its_own_broker(tmp_path: Path) -> None:
    """``terminate {open}``: the parent's broker activates a split's children it hosts once the
    seal is durable, releasing a producer's held handshake without the controller's round trip;
    a request naming anything else is refused before the seal."""
    broker = BrokerProcess(tmp_path / "data", args=["--fence-wait-s", "60"])
    broker.start()
    try:
        await broker.wait_ready()
        async with SegmentAdmin(broker.url) as admin:
            await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF)
            for child, (start, end) in ((1, (0, 0x7FFF)), (2, (0x8000, 0xFFFF))):
                await admin.create_segment(NS, TOPIC, child, start, end, writable=False)
            successors = [Successor(1, 0, 0x7FFF, broker.url), Successor(2, 0x8000, 0xFFFF)]

            for bad, why in (
                ([3], "not successors"),
                ([True], "list of segment ids"),
                ("1", "list of segment ids"),
            ):
                with pytest.raises(AdminError) as refused:
                    await admin._call(
                        "POST",
                        f"/{NS}/{TOPIC}/0/terminate",
                        {"successors": [s.to_json() for s in successors], "open": bad},
                    )
                assert refused.value.status == 400 and why in refused.value.message
            await admin.create_segment(NS, TOPIC, 5, 0, 0xFFFF, writable=False)
            with pytest.raises(AdminError) as away:
                await admin.terminate(NS, TOPIC, 0, [Successor(9, 0, 0xFFFF)], open_after=[9])
            assert away.value.status == 400 and "not hosted on this broker" in away.value.message
            assert (await admin.stats(NS, TOPIC, 0))["sealed"] is False, "refused before sealing"

            connect = asyncio.create_task(SegmentProducer.connect(broker.url, NS, TOPIC, 1, "p"))

            async def handshake_held() -> bool:
                accepted = 'segment_broker_connections_total{role="producer"}'
                return await _metric(broker.url, accepted) >= 1 and not connect.done()

            await _until(handshake_held)
            sealed = await admin.terminate(NS, TOPIC, 0, successors, open_after=[1, 2])
            assert sealed["sealed"] is True and sealed["opened"] == [1, 2]
            async with asyncio.timeout(15):
                producer = await connect
            ack = await (await producer.send_entry([Message(b"first", key=b"k")]))
            assert ack.position == 0
            await producer.close()
            again = await admin.terminate(NS, TOPIC, 0, successors, open_after=[1, 2])
            assert again["opened"] == [1, 2] and again["sealedAt"] == sealed["sealedAt"]
            assert (await admin.stats(NS, TOPIC, 5))["writable"] is False

        broker.kill()
        broker.start()
        await broker.wait_ready()
        async with SegmentAdmin(broker.url) as admin:
            for child in (1, 2):
                assert (await admin.stats(NS, TOPIC, child))["writable"] is True, "durable"
    finally:
        broker.kill()


async def test_a_seal_never_opens_a_copy_fenced_for_a_transfer(tmp_path: Path) -> None:
    async with (
        running_broker(tmp_path / "a") as a,
        running_broker(tmp_path / "b") as b,
        SegmentAdmin(a.url) as admin_a,
        SegmentAdmin(b.url) as admin_b,
    ):
        await admin_a.create_segment(NS, TOPIC, 1, 0, 0xFFFF)
        snapshot = await TransferAdmin(admin_a, NS, TOPIC, 1).snapshot()
        assert snapshot is not None
        await TransferAdmin(admin_b, NS, TOPIC, 1).incoming(snapshot)
        await admin_b.create_segment(NS, TOPIC, 0, 0, 0xFFFF)
        with pytest.raises(AdminError) as refused:
            await admin_b.terminate(NS, TOPIC, 0, [Successor(1, 0, 0xFFFF, b.url)], open_after=[1])
        assert refused.value.status == 400 and "fenced for a transfer" in refused.value.message
        assert (await admin_b.stats(NS, TOPIC, 0))["sealed"] is False
        assert (await admin_b.stats(NS, TOPIC, 1))["writable"] is False


async def test_a_child_its_parents_seal_opened_is_open_after_a_restart_that_lost_the_unfence(
    tmp_path: Path,
) -> None:
    """A seal that opens children records them in its own durable marker, and removes their
    fence markers without waiting for the disk. A restart that finds such a marker still there
    (the removal had not reached the disk: a power loss) opens the child again, with what it
    acknowledged; a successor the seal did not open, and one fenced for a transfer since, stay
    fenced for the controller."""
    data = tmp_path / "data"
    broker = BrokerProcess(data, args=["--fence-wait-s", "60"])
    broker.start()
    children = {1: (0, 0x3FFF), 2: (0x4000, 0x7FFF), 3: (0x8000, 0xFFFF)}
    try:
        await broker.wait_ready()
        async with SegmentAdmin(broker.url) as admin:
            await admin.create_segment(NS, TOPIC, 0, 0, 0xFFFF)
            for child, (start, end) in children.items():
                await admin.create_segment(NS, TOPIC, child, start, end, writable=False)
            successors = [Successor(c, s, e, broker.url) for c, (s, e) in children.items()]
            sealed = await admin.terminate(NS, TOPIC, 0, successors, open_after=[1, 2])
            assert sealed["opened"] == [1, 2]
            async with await SegmentProducer.connect(broker.url, NS, TOPIC, 1, "p") as producer:
                ack = await (await producer.send_entry([Message(b"acked", key=b"k")]))
                assert ack.position == 0
            await TransferAdmin(admin, NS, TOPIC, 2).fence()
        broker.kill()

        def marker(child: int) -> Path:
            (found,) = [
                p.parent
                for p in data.glob(f"{NS}/{TOPIC}/*/segment.json")
                if f'"segmentId":{child}' in p.read_text().replace(" ", "")
            ]
            return found / "fenced.json"

        assert not marker(1).exists()
        marker(1).write_text('{"fencedAt": 0}')
        assert "reason" in marker(2).read_text()

        broker.start()
        await broker.wait_ready()
        async with SegmentAdmin(broker.url) as admin:
            stats = await admin.stats(NS, TOPIC, 1)
            assert stats["writable"] is True and stats["lastPosition"] == 0
            assert not marker(1).exists(), "the recovery's opening is durable"
            assert (await admin.stats(NS, TOPIC, 2))["writable"] is False
            assert (await admin.stats(NS, TOPIC, 3))["writable"] is False
    finally:
        broker.kill()

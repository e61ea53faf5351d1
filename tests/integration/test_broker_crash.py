"""Crash safety of the segment broker, with a real broker process that is SIGKILLed.

* Every entry acknowledged before the kill is stored after the restart, at the acknowledged
  position, in order, with its content.
* Retrying the unacknowledged entries (same producer name and sequence ids) creates no
  duplicate: entries that did reach the log are answered as duplicates.
* A torn or garbage tail is truncated at recovery and counted in the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from scalable_topics.client.segment import (
    ConnectionClosedError,
    EntryAck,
    SegmentAdmin,
    SegmentConsumer,
    SegmentProducer,
    UnackedEntry,
)
from scalable_topics.core.wire import Message, decode_entry
from segment_broker.storage.log import RECORD_HEADER_SIZE, scan_records
from segment_broker.testing import BrokerProcess

pytestmark = pytest.mark.integration

NS, TOPIC = "crash", "orders"


async def _read_all(url: str, subscription: str, last: int) -> list[tuple[int, bytes]]:
    """Every entry of the segment up to ``last`` as ``(position, entry bytes)``."""
    out: list[tuple[int, bytes]] = []
    async with await SegmentConsumer.connect(
        url, NS, TOPIC, 0, subscription, "reader", permits=5000
    ) as consumer:
        async with asyncio.timeout(60):
            while not out or out[-1][0] < last:
                item = await consumer.receive()
                assert item is not None
                out.append((item.position, bytes(item.entry)))
    return out


async def _produce_until_killed(
    url: str,
    name: str,
    acked: dict[int, int],
    stop: asyncio.Event,
    progress: asyncio.Event,
    sent: Counter[str],
    sending: asyncio.Event,
) -> list[UnackedEntry]:
    """Pipeline entries of 20 messages until the connection dies; returns the unacked ones.
    ``sent`` counts the entries handed to the connection, and ``sending`` is set with each."""
    producer = await SegmentProducer.connect(url, NS, TOPIC, 0, name)
    futures: list[asyncio.Future[EntryAck]] = []

    def record(fut: asyncio.Future[EntryAck]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            ack = fut.result()
            acked[ack.sequence_id] = ack.position
            progress.set()

    seq = 0
    try:
        while not stop.is_set():
            msgs = [
                Message(value=f"{name}:{seq}:{i}".encode(), key=f"k{i}".encode()) for i in range(20)
            ]
            fut = await producer.send_entry(msgs)
            fut.add_done_callback(record)
            futures.append(fut)
            sent[name] += 1
            sending.set()
            seq += 1
            if producer.inflight_entries > 64:
                await asyncio.sleep(0)
    except ConnectionClosedError as exc:
        return exc.unacked
    # Stopped (the broker is killed) before a send saw the connection die: every entry sent
    # may be acknowledged already, and the producer learns of the end from its reader.
    await asyncio.gather(*futures, return_exceptions=True)
    failure = await producer.wait_failed()
    with contextlib.suppress(Exception):
        await producer.close()
    assert isinstance(failure, ConnectionClosedError), failure
    return failure.unacked


def _lose_unsynced_tail(segment_dir: Path, last_acked: int) -> None:
    """Power-loss model (as lazyfs does): drop everything after the last acknowledged record.

    Acks follow the fdatasync that covers them, so the synced prefix reaches at least the last
    acknowledged record; anything after it may be gone after a machine crash.
    """
    for path in sorted(segment_dir.glob("log-*.log")):
        data = path.read_bytes()
        if int(path.name[4:24]) > last_acked:
            path.unlink()
            continue
        for pos, off, length in scan_records(data):
            if pos == last_acked:
                with open(path, "r+b") as fh:
                    fh.truncate(off + RECORD_HEADER_SIZE + length)


@pytest.mark.parametrize("crash", ["process", "power_loss"])
async def test_sigkill_loses_no_acknowledged_entry_and_retries_do_not_duplicate(
    tmp_path: Path, crash: str
) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        await broker.wait_ready()
        async with SegmentAdmin(broker.url) as admin:
            await admin.create_segment(
                NS, TOPIC, 0, 0, 0xFFFF, subscriptions={"audit": "Exclusive"}
            )

        names = ["p0", "p1", "p2"]
        acked: dict[str, dict[int, int]] = {n: {} for n in names}
        stop = asyncio.Event()
        progress = asyncio.Event()
        sent: Counter[str] = Counter()
        sending = asyncio.Event()
        tasks = [
            asyncio.create_task(
                _produce_until_killed(broker.url, n, acked[n], stop, progress, sent, sending)
            )
            for n in names
        ]
        # 600 entries are a second's work on a quiet machine; CI runs this beside four clusters.
        async with asyncio.timeout(120):
            while sum(len(a) for a in acked.values()) < 600:
                progress.clear()
                await progress.wait()
        # Frozen wherever it is (a write, a sync, an ack half sent), the broker is killed once
        # every producer has sent after the freeze: those entries cannot have been acknowledged,
        # so the retry below always has some (a loaded machine could otherwise let the broker
        # acknowledge everything sent before the kill).
        broker.freeze()
        before = Counter(sent)
        async with asyncio.timeout(30):
            while any(sent[n] <= before[n] for n in names):
                sending.clear()
                await sending.wait()
        broker.kill()
        stop.set()
        async with asyncio.timeout(30):
            unacked = dict(zip(names, await asyncio.gather(*tasks), strict=True))
        assert all(acked[n] for n in names)
        if crash == "power_loss":
            last_acked = max(max(a.values()) for a in acked.values())
            (segment_dir,) = (tmp_path / "data" / NS / TOPIC).iterdir()
            _lose_unsynced_tail(segment_dir, last_acked)

        broker.start()
        await broker.wait_ready()
        async with SegmentAdmin(broker.url) as admin:
            stats = await admin.stats(NS, TOPIC, 0)
        last = stats["lastPosition"]
        stored = await _read_all(broker.url, "audit", last)
        assert [p for p, _ in stored] == list(range(last + 1))
        by_key: dict[tuple[str, int], int] = {}
        for pos, entry in stored:
            header, messages = decode_entry(entry)
            key = (header.producer_name, header.sequence_id)
            assert key not in by_key, f"duplicate entry {key}"
            by_key[key] = pos
            assert messages[0].value == f"{header.producer_name}:{header.sequence_id}:0".encode()
            assert len(messages) == 20
        for name in names:
            for seq, pos in acked[name].items():
                assert by_key.get((name, seq)) == pos, f"acked {name}/{seq} lost or moved"
            seqs = [s for (n, s), _ in sorted(by_key.items(), key=lambda kv: kv[1]) if n == name]
            assert seqs == sorted(seqs)

        # Retry everything that was not acknowledged, with the original sequence ids.
        total_unacked = 0
        for name in names:
            producer = await SegmentProducer.connect(broker.url, NS, TOPIC, 0, name)
            assert producer.last_sequence_id >= max(acked[name])
            futs = [await producer.publish(u.sequence_id, u.entry) for u in unacked[name]]
            acks = await asyncio.gather(*futs)
            total_unacked += len(acks)
            for item, ack in zip(unacked[name], acks, strict=True):
                if (name, item.sequence_id) in by_key:
                    assert ack.duplicate
                    assert ack.position == by_key[(name, item.sequence_id)]
                else:
                    assert not ack.duplicate
            await producer.close()
        assert total_unacked > 0, "the kill should have caught some entries in flight"

        async with SegmentAdmin(broker.url) as admin:
            last2 = (await admin.stats(NS, TOPIC, 0))["lastPosition"]
        final = await _read_all(broker.url, "audit", last2)
        keys = [(h.producer_name, h.sequence_id) for h, _ in (decode_entry(e) for _, e in final)]
        assert len(keys) == len(set(keys)), "retry created duplicates"
        for name in names:
            expected = set(acked[name]) | {u.sequence_id for u in unacked[name]}
            assert {s for n, s in keys if n == name} == expected
    finally:
        broker.terminate()


async def _metric(url: str, name: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("damage", ["garbage", "torn_record"])
async def test_torn_tail_after_kill_is_truncated_and_counted(tmp_path: Path, damage: str) -> None:
    data = tmp_path / "data"
    broker = BrokerProcess(data)
    broker.start()
    try:
        await broker.wait_ready()
        async with SegmentAdmin(broker.url) as admin:
            await admin.create_segment(
                NS, TOPIC, 0, 0, 0xFFFF, subscriptions={"audit": "Exclusive"}
            )
        producer = await SegmentProducer.connect(broker.url, NS, TOPIC, 0, "p")
        futs = [await producer.send_entry([Message(value=b"v%d" % i)]) for i in range(50)]
        acks = await asyncio.gather(*futs)
        await producer.close()
        broker.kill()

        logs = sorted((data / NS / TOPIC).glob("*/log-*.log"))
        assert logs
        last_file = logs[-1]
        intact = last_file.read_bytes()
        if damage == "garbage":
            last_file.write_bytes(intact + b"\x17garbage that is not a record" * 3)
        else:
            # The first 30 bytes of a copy of the last record: a write torn by the crash.
            last_file.write_bytes(intact + intact[-40:-10])

        broker.start()
        await broker.wait_ready()
        assert await _metric(broker.url, "segment_broker_torn_tail_truncations_total") == 1.0
        assert last_file.read_bytes() == intact
        stored = await _read_all(broker.url, "audit", 49)
        assert [p for p, _ in stored] == [a.position for a in acks] == list(range(50))
        assert [decode_entry(e)[1][0].value for _, e in stored] == [b"v%d" % i for i in range(50)]
        producer = await SegmentProducer.connect(broker.url, NS, TOPIC, 0, "p")
        ack = await (await producer.send_entry([Message(value=b"after")]))
        assert ack.position == 50 and not ack.duplicate
        await producer.close()
    finally:
        broker.terminate()

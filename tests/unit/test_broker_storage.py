"""Segment storage: group commit, recovery of torn tails, rolling, dedup across restarts,
retention, the seal marker."""

from __future__ import annotations

import asyncio
import json
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from scalable_topics.core import wire
from scalable_topics.core.subscriptions import BrokerSubscriptionType
from scalable_topics.core.wire import Message
from segment_broker.storage.log import CLEAN_SHUTDOWN, RECORD_HEADER
from segment_broker.storage.segment import (
    Retention,
    SealInfo,
    Segment,
    SegmentMeta,
    SegmentSealedError,
    StorageSettings,
)


def _meta(retention: Retention | None = None) -> SegmentMeta:
    return SegmentMeta("ns", "t", 0, 0, 0xFFFF, 1, 0.0, retention or Retention())


async def _open(
    path: Path,
    executor: ThreadPoolExecutor,
    *,
    subs: dict[str, str] | None = None,
    retention: Retention | None = None,
    **kw: int,
) -> Segment:
    meta = _meta(retention)
    if not (path / "segment.json").exists():
        Segment.create_blocking(path, meta, subs or {"s": "Exclusive"})
    seg = Segment(path, meta, StorageSettings(**kw), executor)  # type: ignore[arg-type]
    await seg.open()
    return seg


def _entry(producer: str, seq: int, value: bytes = b"v") -> tuple[bytes, wire.EntryHeader]:
    e = wire.encode_entry(producer, seq, [Message(value, key=b"k")])
    return e, wire.decode_entry_header(e)


async def _append(seg: Segment, producer: str, seq: int, value: bytes = b"v") -> tuple[int, bool]:
    e, h = _entry(producer, seq, value)
    return seg.append(e, h)


async def _durable(seg: Segment, position: int) -> None:
    async with asyncio.timeout(10):
        while seg.visible_position < position:
            await seg.wait_flushed()


async def _append_durably(seg: Segment, count: int, value: bytes) -> None:
    """Entries 0 … count-1 of producer ``p``, each one flushed before the next is appended."""
    for i in range(count):
        await _append(seg, "p", i, value)
        await _durable(seg, i)


async def test_group_commit_flushes_many_entries_with_few_fsyncs(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    seg = await _open(tmp_path / "s", executor)
    positions = [(await _append(seg, "p", i))[0] for i in range(500)]
    assert positions == list(range(500))
    assert seg.visible_position < 499, "nothing is visible before its flush"
    await _durable(seg, 499)
    assert seg.fsyncs < 50
    assert seg.entries_in == 500
    assert [p for p, _ in seg.read(0, 1000, 1 << 30)] == list(range(500))
    await seg.close()


async def test_recovery_keeps_entries_and_dedup_across_restart(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    path = tmp_path / "s"
    seg = await _open(path, executor, roll_bytes=2000)
    for i in range(100):
        await _append(seg, "a", i, b"x" * 20)
        await _append(seg, "b", 1000 + i, b"y" * 20)
        await _durable(seg, 2 * i + 1)
    await seg.close()
    assert len(seg.log.files) > 3, "small roll size should have produced several files"

    seg = await _open(path, executor, roll_bytes=2000)
    assert seg.log.next_position == 200
    assert seg.last_sequence_id("a") == 99 and seg.last_sequence_id("b") == 1099
    assert await _append(seg, "a", 99) == (198, True), "last entry of a, original position"
    assert (await _append(seg, "a", 5))[1], "an older sequence id is a duplicate too"
    assert await _append(seg, "a", 100) == (200, False)
    await _durable(seg, 200)
    got = seg.read(0, 1000, 1 << 30)
    while got[-1][0] < 200:
        got += seg.read(got[-1][0] + 1, 1000, 1 << 30)
    assert [p for p, _ in got] == list(range(201))
    values = [wire.decode_entry(e)[1][0].value for _, e in got]
    assert values[:4] == [b"x" * 20, b"y" * 20, b"x" * 20, b"y" * 20]
    await seg.close()


@pytest.mark.parametrize("damage", ["torn_header", "torn_body", "bad_crc", "wrong_position"])
async def test_torn_tail_is_truncated_to_the_last_intact_record(
    tmp_path: Path, executor: ThreadPoolExecutor, damage: str
) -> None:
    path = tmp_path / "s"
    seg = await _open(path, executor)
    for i in range(10):
        await _append(seg, "p", i)
    await _durable(seg, 9)
    await seg.close()
    # A crash, not a clean close: after a clean shutdown no tail can be torn (and the same
    # damage is corruption, see test_broker_corruption.py).
    (path / CLEAN_SHUTDOWN).unlink()
    log_file = seg.log.files[-1].path
    intact = log_file.read_bytes()
    entry, _ = _entry("p", 10)
    record = RECORD_HEADER.pack(len(entry), 0, 10) + entry
    import crc32c

    good = RECORD_HEADER.pack(len(entry), crc32c.crc32c(entry), 10) + entry
    tail = {
        "torn_header": good[:7],
        "torn_body": good[:-3],
        "bad_crc": record,
        "wrong_position": RECORD_HEADER.pack(len(entry), crc32c.crc32c(entry), 42) + entry,
    }[damage]
    log_file.write_bytes(intact + tail)

    seg = await _open(path, executor)
    assert seg.recovery is not None and seg.recovery.truncated_bytes == len(tail)
    assert log_file.read_bytes() == intact
    assert seg.log.next_position == 10
    assert await _append(seg, "p", 10) == (10, False)
    await _durable(seg, 10)
    await seg.close()


async def test_seal_refuses_appends_but_answers_duplicates(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    path = tmp_path / "s"
    seg = await _open(path, executor)
    for i in range(3):
        await _append(seg, "p", i)
    info = await seg.terminate([{"segmentId": 1, "range": {"start": 0, "end": 5}}])
    assert info.last_position == 2
    assert seg.visible_position == 2, "everything staged before the seal is durable"
    with pytest.raises(SegmentSealedError) as exc:
        await _append(seg, "p", 3)
    assert exc.value.seal == info
    assert await _append(seg, "p", 1) == (1, True)
    assert (await seg.terminate([])) == info
    await seg.close()
    seg = await _open(path, executor)
    assert seg.seal == info and seg.sealed_event.is_set()
    await seg.close()


async def test_a_seal_records_the_children_it_opens(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    path = tmp_path / "s"
    seg = await _open(path, executor)
    successors = [{"segmentId": 1, "range": {"start": 0, "end": 5}}]
    info = await seg.terminate(successors, open_after=[1])
    assert info.open == (1,)
    await seg.close()
    seg = await _open(path, executor)
    assert seg.seal == info
    await seg.close()
    written = json.loads((path / "sealed.json").read_text())
    assert written["open"] == [1]
    del written["open"]
    assert SealInfo.from_json(written).open == (), "a seal written before the field opens none"


async def test_retention_deletes_whole_files_below_every_cursor(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    path = tmp_path / "s"
    seg = await _open(path, executor, subs={"a": "Exclusive", "b": "Queue"}, roll_bytes=1000)
    await _append_durably(seg, 60, b"z" * 40)
    files_before = len(seg.log.files)
    assert files_before > 3
    seg.cursors["a"].ack_cumulative(59)
    assert await seg.apply_retention() == 0, "cursor b still needs everything"
    seg.cursors["b"].ack_cumulative(30)
    deleted = await seg.apply_retention()
    assert deleted > 0
    assert seg.log.first_position <= 31
    assert all(lf.next_position > 31 or lf is seg.log.files[-1] for lf in seg.log.files)
    assert not any(
        p.name.startswith("log-") and int(p.name[4:24]) < seg.log.first_position
        for p in path.iterdir()
    )
    assert seg.read(seg.log.first_position, 1, 1 << 20)
    await seg.close()
    seg = await _open(path, executor, roll_bytes=1000)
    assert seg.log.first_position <= 31 and seg.log.next_position == 60
    assert seg.last_sequence_id("p") == 59
    await seg.close()


async def test_cursors_are_persisted_and_reloaded(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    path = tmp_path / "s"
    seg = await _open(path, executor, cursor_flush_ms=10)
    for i in range(5):
        await _append(seg, "p", i)
    await _durable(seg, 4)
    seg.cursors["s"].ack_cumulative(1)
    seg.cursors["s"].ack(3)
    await seg.add_cursor("late", BrokerSubscriptionType.QUEUE, at_end=True)
    await seg.close()
    seg = await _open(path, executor)
    assert seg.cursors["s"].ack_floor == 2 and seg.cursors["s"].is_acked(3)
    assert seg.cursors["late"].ack_floor == 5
    assert seg.backlog(seg.cursors["s"]) == 2
    await seg.close()


def test_message_count_offset_matches_the_header() -> None:
    e, h = _entry("p", 1)
    assert Segment.message_count(e) == h.message_count
    assert struct.unpack_from("<I", e, 18)[0] == 1


async def _consumed(
    path: Path, executor: ThreadPoolExecutor, retention: Retention, entries: int
) -> Segment:
    """A segment rolling at 1000 bytes with ``entries`` durable entries, all acknowledged."""
    seg = await _open(path, executor, retention=retention, roll_bytes=1000)
    await _append_durably(seg, entries, b"z" * 40)
    seg.cursors["s"].ack_cumulative(entries - 1)
    return seg


async def test_size_retention_keeps_the_newest_files_even_when_consumed(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    seg = await _consumed(tmp_path / "s", executor, Retention(size_bytes=3000), 60)
    assert await seg.apply_retention() > 0
    assert 3000 - 1100 <= seg.log.total_bytes <= 3000 + 1100
    await seg.close()


async def test_time_retention_keeps_young_files_even_when_consumed(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    seg = await _consumed(tmp_path / "s", executor, Retention(time_ms=3_600_000), 30)
    assert await seg.apply_retention() == 0, "everything is younger than an hour"
    await seg.close()


async def test_damaged_rolled_file_is_never_served(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    path = tmp_path / "s"
    seg = await _open(path, executor, roll_bytes=1000)
    await _append_durably(seg, 40, b"q" * 40)
    await seg.close()
    first = seg.log.files[0]
    raw = bytearray(first.path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    first.path.write_bytes(bytes(raw))
    seg = await _open(path, executor, roll_bytes=1000)
    got = seg.read(0, 1000, 1 << 20)
    assert len(got) < first.next_position, "reading stops before the damaged record"
    assert all(wire.decode_entry(e)[1][0].value == b"q" * 40 for _, e in got)
    await seg.close()


async def test_a_segment_says_it_is_due_for_housekeeping_on_a_cursor_change_or_a_roll(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    """The store's housekeeping rounds visit the segments that said so (and all of them only
    once a second): an ack, a new subscription and a log roll each make the segment due; an
    idle one never does."""
    seg = await _open(tmp_path / "s", executor, roll_bytes=1000)
    due: list[Segment] = []
    seg.on_due = due.append
    await _append_durably(seg, 3, b"x")
    assert due == [], "appends within one file leave nothing to persist or retain"
    seg.cursors["s"].ack_cumulative(1)
    assert due == [seg]
    await seg.add_cursor("late", BrokerSubscriptionType.QUEUE, at_end=False)
    seg.cursors["late"].ack(0)
    assert due == [seg, seg]
    due.clear()
    await _append_durably(seg, 60, b"z" * 40)
    assert due, "a roll makes retention due"
    assert len(seg.log.files) > 1
    await seg.close()

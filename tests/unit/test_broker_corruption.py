"""Corruption of a segment log is reported and quarantined, never truncated (issue 11, part 2).

A torn tail (a damaged record in the last file with nothing intact after it, after a crash) is
still cut off; a damaged record followed by intact ones, any damage in a rolled file, or any
damage after a clean shutdown quarantines the segment: the bytes stay as they are, appends,
seals and retention are refused, positions before the damage are served, and only an explicit
truncation at the damaged position lifts it.
"""

from __future__ import annotations

import hashlib
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import crc32c
import pytest
from aiohttp import web

from scalable_topics.core import wire
from scalable_topics.core.subscriptions import BrokerSubscriptionType
from segment_broker.corruption import CorruptionStatus
from segment_broker.dispatch import Dispatcher
from segment_broker.metrics import BrokerMetrics
from segment_broker.server import Broker, ConsumerConnection
from segment_broker.storage.cursor import Cursor
from segment_broker.storage.log import (
    CLEAN_SHUTDOWN,
    INDEX_HEADER,
    INDEX_ITEM,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    Corruption,
    find_intact_record,
    index_name,
    scan_records,
)
from segment_broker.storage.segment import Segment, SegmentCorruptedError
from tests.unit.test_broker_storage import _append, _durable, _open
from tests.unit.test_broker_storage_pipeline import _until


def _offset_of(path: Path, position: int) -> int:
    for pos, off, _ in scan_records(path.read_bytes()):
        if pos == position:
            return off
    raise AssertionError(f"position {position} not in {path}")


def _flip(path: Path, offset: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def _digest(directory: Path) -> dict[str, str]:
    """Content hash of every log file (and index) of a segment directory."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.name.startswith("log-")
    }


async def _fill(seg: Segment, count: int, value: bytes = b"x" * 100) -> None:
    """Entries 0 … count-1 of producer ``p``, flushed ten at a time (a file rolls between two
    flushes, so small ``roll_bytes`` give several files)."""
    for i in range(count):
        await _append(seg, "p", i, value)
        if i % 10 == 9:
            await _durable(seg, i)
    await _durable(seg, count - 1)


async def _rolled_with_indexes(path: Path, executor: ThreadPoolExecutor, count: int) -> Segment:
    """A closed segment of ``count`` entries in several files, every rolled file indexed."""
    seg = await _open(path, executor, roll_bytes=2000)
    await _fill(seg, count)
    assert len(seg.log.files) >= 4
    await _indexed(path, seg)
    await seg.close()
    return seg


async def _indexed(path: Path, seg: Segment) -> None:
    """Wait for the background tasks that write the rolled files' indexes."""
    rolled = seg.log.files[:-1]
    await _until(
        lambda: all((path / index_name(lf.base)).exists() for lf in rolled), "rolled indexes"
    )


def _crash(path: Path) -> None:
    """What a crash leaves instead of a clean close: no clean-shutdown marker."""
    (path / CLEAN_SHUTDOWN).unlink()


# Where one bit flips in the record of position 100: entry body, or each header field.
_FIELDS = {"entry": RECORD_HEADER_SIZE + 30, "length": 2, "crc": 5, "position": 8}


@pytest.mark.parametrize("field", list(_FIELDS))
async def test_a_flipped_bit_in_the_middle_of_the_active_file_quarantines_without_truncating(
    tmp_path: Path, executor: ThreadPoolExecutor, field: str
) -> None:
    path = tmp_path / "s"
    seg = await _open(path, executor)
    await _fill(seg, 200)
    await seg.close()
    _crash(path)
    log_file = seg.log.files[-1].path
    off = _offset_of(log_file, 100)
    _flip(log_file, off + _FIELDS[field], bit=3 if field == "length" else 0)
    damaged = log_file.read_bytes()

    seg = await _open(path, executor)
    corruption = seg.corruption
    assert corruption is not None
    assert (corruption.position, corruption.file, corruption.offset, corruption.source) == (
        100,
        log_file.name,
        off,
        "recovery",
    )
    assert "intact records follow" in corruption.reason
    assert seg.recovery is not None and seg.recovery.truncated_bytes == 0
    assert seg.recovery.corruption == corruption
    assert log_file.read_bytes() == damaged, "not one byte changed"
    assert seg.servable_position == 99 and seg.visible_position == 99
    assert [p for p, _ in seg.read(0, 1000, 1 << 30)] == list(range(100))
    assert seg.read(100, 10, 1 << 20) == []
    with pytest.raises(SegmentCorruptedError) as refused:
        await _append(seg, "p", 200)
    assert refused.value.corruption == corruption
    assert "position 100" in str(refused.value)
    with pytest.raises(SegmentCorruptedError):
        await seg.terminate([])
    assert not seg.sealed
    await seg.close()
    assert log_file.read_bytes() == damaged

    seg = await _open(path, executor)
    assert seg.corruption is not None and seg.corruption.position == 100, "still quarantined"
    assert "clean shutdown" in seg.corruption.reason
    await seg.close()
    assert log_file.read_bytes() == damaged


@pytest.mark.parametrize("shutdown", ["clean", "crash"])
async def test_a_flipped_bit_in_an_earlier_indexed_file_quarantines(
    tmp_path: Path, executor: ThreadPoolExecutor, shutdown: str
) -> None:
    path = tmp_path / "s"
    seg = await _rolled_with_indexes(path, executor, 100)
    if shutdown == "crash":
        _crash(path)
    target = seg.log.files[1]
    position = target.base + 2
    off = _offset_of(target.path, position)
    _flip(target.path, off + RECORD_HEADER_SIZE + 5)
    before = _digest(path)

    seg = await _open(path, executor, roll_bytes=2000)
    corruption = seg.corruption
    assert corruption is not None
    assert (corruption.position, corruption.file, corruption.offset) == (
        position,
        target.path.name,
        off,
    )
    assert "rolled file" in corruption.reason
    assert _digest(path) == before, "no file was truncated, removed or rewritten"
    assert seg.visible_position == position - 1
    got = seg.read(0, 1000, 1 << 30)
    while got and got[-1][0] < position - 1:
        got += seg.read(got[-1][0] + 1, 1000, 1 << 30)
    assert [p for p, _ in got] == list(range(position))
    assert seg.read(position, 10, 1 << 20) == []
    with pytest.raises(SegmentCorruptedError):
        await _append(seg, "p", 100)
    await seg.close()


@pytest.mark.parametrize("tail", ["zeros", "torn_record"])
async def test_a_torn_tail_after_a_crash_is_still_truncated(
    tmp_path: Path, executor: ThreadPoolExecutor, tail: str
) -> None:
    path = tmp_path / "s"
    seg = await _open(path, executor)
    await _fill(seg, 50)
    await seg.close()
    _crash(path)
    log_file = seg.log.files[-1].path
    intact = log_file.read_bytes()
    # A zero-filled block (the file grew, its data never reached the disk), or the start of a
    # record the crash cut short.
    extra = bytes(4096) if tail == "zeros" else intact[-200:-20]
    log_file.write_bytes(intact + extra)

    seg = await _open(path, executor)
    assert seg.corruption is None
    assert seg.recovery is not None and seg.recovery.truncated_bytes == len(extra)
    assert log_file.read_bytes() == intact
    assert await _append(seg, "p", 50) == (50, False)
    await seg.close()


async def test_after_a_clean_shutdown_a_damaged_tail_is_corruption(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    """A clean close synced everything: a damaged last record then is damage, not a crash."""
    path = tmp_path / "s"
    seg = await _open(path, executor)
    await _fill(seg, 50)
    await seg.close()
    log_file = seg.log.files[-1].path
    off = _offset_of(log_file, 49)
    _flip(log_file, off + RECORD_HEADER_SIZE + 1)
    damaged = log_file.read_bytes()

    seg = await _open(path, executor)
    assert seg.corruption is not None and seg.corruption.position == 49
    assert "after a clean shutdown" in seg.corruption.reason
    assert seg.recovery is not None and seg.recovery.truncated_bytes == 0
    assert log_file.read_bytes() == damaged
    await seg.close()


async def test_a_last_file_shorter_than_at_the_clean_shutdown_is_corruption(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    path = tmp_path / "s"
    seg = await _open(path, executor)
    await _fill(seg, 50)
    await seg.close()
    log_file = seg.log.files[-1].path
    cut = _offset_of(log_file, 40)
    log_file.write_bytes(log_file.read_bytes()[:cut])

    seg = await _open(path, executor)
    assert seg.corruption is not None
    assert (seg.corruption.position, seg.corruption.offset) == (40, cut)
    assert "clean shutdown" in seg.corruption.reason
    await seg.close()


async def test_a_read_that_meets_damage_quarantines_and_tells_the_listeners(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    path = tmp_path / "s"
    seg = await _open(path, executor, roll_bytes=2000, cache_bytes=1)
    await _fill(seg, 100)
    heard: list[Corruption] = []
    seg.corruption_listeners.add(heard.append)
    target = seg.log.files[1]
    position = target.base + 1
    _flip(target.path, _offset_of(target.path, position) + RECORD_HEADER_SIZE + 2)

    got = seg.read(target.base, 1000, 1 << 30)
    assert [p for p, _ in got] == [target.base], "the entries before the damage are returned"
    corruption = seg.corruption
    assert corruption is not None
    assert (corruption.position, corruption.source, corruption.reason) == (
        position,
        "read",
        "checksum mismatch",
    )
    assert heard == [corruption]
    assert seg.servable_position == position - 1 < seg.visible_position
    assert seg.read(position, 10, 1 << 20) == []
    assert seg.read(position + 5, 10, 1 << 20) == [], "nothing beyond the damage either"
    with pytest.raises(SegmentCorruptedError):
        await _append(seg, "p", 100)
    assert seg.read(0, 1, 1 << 20)[0][0] == 0, "positions before the damage are still served"
    assert heard == [corruption], "told once"
    await seg.close()


async def test_truncate_at_the_damaged_position_lifts_the_quarantine(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    path = tmp_path / "s"
    seg = await _open(path, executor, subs={"a": "Exclusive", "b": "Queue"})
    await _fill(seg, 200)
    seg.cursors["a"].ack_cumulative(149)  # consumed past the damage before it happened
    seg.cursors["b"].ack(90)
    seg.cursors["b"].ack(120)
    await seg.close()
    _crash(path)
    log_file = seg.log.files[-1].path
    off = _offset_of(log_file, 100)
    size = log_file.stat().st_size
    _flip(log_file, off + RECORD_HEADER_SIZE + 7)

    seg = await _open(path, executor, subs={"a": "Exclusive", "b": "Queue"})
    assert seg.corruption is not None
    with pytest.raises(ValueError, match="not corrupted at position 101"):
        await seg.truncate(101)
    report = await seg.truncate(100)
    assert report.position == 100 and report.dropped_bytes == size - off
    assert report.dropped_files == []
    assert log_file.stat().st_size == off

    seg = await _open(path, executor)
    assert seg.corruption is None and seg.log.next_position == 100
    assert seg.cursors["a"].ack_floor == 100, "the cursor came back to the new end"
    assert seg.cursors["b"].is_acked(90) and not seg.cursors["b"].is_acked(120)
    assert seg.last_sequence_id("p") == 99
    assert await _append(seg, "p", 100) == (100, False)
    await _durable(seg, 100)
    assert [p for p, _ in seg.read(95, 10, 1 << 20)] == list(range(95, 100))
    assert [p for p, _ in seg.read(100, 10, 1 << 20)] == [100]
    await seg.close()


async def test_truncate_in_an_earlier_file_drops_the_later_files_and_moves_the_seal(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    path = tmp_path / "s"
    seg = await _open(path, executor, roll_bytes=2000)
    await _fill(seg, 100)
    await seg.terminate([{"segmentId": 1, "range": {"start": 0, "end": 0xFFFF}}])
    await _indexed(path, seg)
    await seg.close()
    target = seg.log.files[1]
    position = target.base + 3
    off = _offset_of(target.path, position)
    _flip(target.path, off + RECORD_HEADER_SIZE + 4)
    later = [lf.path.name for lf in seg.log.files[2:]]

    seg = await _open(path, executor, roll_bytes=2000)
    assert seg.corruption is not None and seg.corruption.position == position
    assert seg.seal is not None and seg.seal.last_position == 99
    report = await seg.truncate(position)
    assert report.dropped_files == later
    names = {p.name for p in path.iterdir()}
    assert not any(n in names for n in later)
    assert index_name(target.base) not in names, "the cut file is the active one now"
    assert not any(n.startswith("dedup-") and int(n[6:26]) > position for n in names), (
        "no dedup snapshot describes entries that are gone"
    )

    seg = await _open(path, executor, roll_bytes=2000)
    assert seg.corruption is None and seg.log.next_position == position
    assert seg.seal is not None and seg.seal.last_position == position - 1
    assert seg.last_sequence_id("p") == position - 1
    await seg.close()


async def test_a_damaged_index_is_rebuilt_and_is_not_corruption(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    path = tmp_path / "s"
    seg = await _rolled_with_indexes(path, executor, 100)
    idx = path / index_name(seg.log.files[1].base)
    original = idx.read_bytes()
    _flip(idx, 24)  # the file checksum the index carries
    logs_before = {k: v for k, v in _digest(path).items() if k.endswith(".log")}

    seg = await _open(path, executor, roll_bytes=2000)
    assert seg.corruption is None
    header = INDEX_HEADER.size
    assert idx.read_bytes()[:header] == original[:header], "rebuilt from the verified file"
    assert {k: v for k, v in _digest(path).items() if k.endswith(".log")} == logs_before
    await seg.close()


async def test_an_index_without_a_checksum_is_verified_record_by_record_and_rewritten(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    """Indexes written before they carried the file's checksum (16-byte header)."""
    path = tmp_path / "s"
    seg = await _rolled_with_indexes(path, executor, 100)
    target = seg.log.files[1]
    idx = path / index_name(target.base)
    raw = idx.read_bytes()
    _, next_position, size, _, _ = INDEX_HEADER.unpack_from(raw, 0)
    idx.write_bytes(struct.pack("<qQ", next_position, size) + raw[INDEX_HEADER.size :])
    _flip(target.path, _offset_of(target.path, target.base + 1) + RECORD_HEADER_SIZE)

    seg = await _open(path, executor, roll_bytes=2000)
    assert seg.corruption is not None and seg.corruption.position == target.base + 1
    await seg.close()

    seg = await _rolled_with_indexes(tmp_path / "t", executor, 100)
    idx = tmp_path / "t" / index_name(seg.log.files[1].base)
    raw = idx.read_bytes()
    items = raw[INDEX_HEADER.size :]
    _, next_position, size, _, _ = INDEX_HEADER.unpack_from(raw, 0)
    idx.write_bytes(struct.pack("<qQ", next_position, size) + items)
    seg = await _open(tmp_path / "t", executor, roll_bytes=2000)
    assert seg.corruption is None
    rewritten = idx.read_bytes()
    assert rewritten[: INDEX_HEADER.size] == raw[: INDEX_HEADER.size], "with the file checksum"
    assert (len(rewritten) - INDEX_HEADER.size) % INDEX_ITEM.size == 0
    await seg.close()


def test_find_intact_record_sees_past_damage_and_not_into_garbage() -> None:
    entry = os.urandom(300)
    record = RECORD_HEADER.pack(len(entry), crc32c.crc32c(entry), 7) + entry
    garbage = os.urandom(1 << 20)
    data = b"\x00" * 20 + garbage + record
    assert find_intact_record(data, 0, 5) == 20 + len(garbage)
    assert find_intact_record(data, 0, 8) is None, "position 7 cannot follow a damaged 8"
    assert find_intact_record(b"\x00" * 20 + bytes(8 << 20), 0, 5) is None
    assert find_intact_record(b"\x00" * 20 + garbage, 0, 5) is None
    empty = RECORD_HEADER.pack(0, 0, 5)
    assert find_intact_record(b"\x00" * 20 + empty * 4, 0, 5) is None, "empty entries never count"
    assert find_intact_record(record + record, 0, 7) == len(record), "the damaged one is skipped"


def test_cursor_truncate_forgets_acknowledgements_at_and_above_the_cut() -> None:
    cur = Cursor("s", BrokerSubscriptionType.QUEUE)
    cur.ack_cumulative(9)
    for p in (12, 13, 20, 21, 22, 30):
        cur.ack(p)
    assert cur.truncate(21)
    assert cur.ack_floor == 10
    assert [cur.is_acked(p) for p in (12, 13, 20, 21, 22, 30)] == [True, True, True] + [False] * 3
    assert cur.backlog(40) == 30 - 3
    assert not cur.truncate(25), "nothing at or above 25 any more"
    assert cur.truncate(5) and cur.ack_floor == 5 and cur.backlog(40) == 35


class _Sink:
    def __init__(self) -> None:
        self.items: list[tuple[int, int, Any]] = []
        self.corruption: Corruption | None = None

    def deliver(self, items: list[tuple[int, int, Any]]) -> None:
        self.items.extend(items)

    def end_of_segment(self, last_position: int) -> None:
        raise AssertionError("a quarantined segment never ends")

    def end_of_buckets(self, last_position: int) -> None:
        raise AssertionError("a quarantined segment never ends")

    def buckets_done(self, last_position: int, buckets: list[int]) -> None:
        raise AssertionError("a quarantined segment never ends")

    def corrupted(self, corruption: Corruption) -> None:
        assert self.corruption is None, "told once"
        self.corruption = corruption


async def test_a_consumer_is_told_once_it_acknowledged_everything_before_the_damage(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    path = tmp_path / "s"
    subs = {"a": "Exclusive", "b": "Queue"}
    seg = await _open(path, executor, subs=subs)
    await _fill(seg, 200)
    seg.cursors["b"].ack_cumulative(149)
    await seg.close()
    _crash(path)
    log_file = seg.log.files[-1].path
    _flip(log_file, _offset_of(log_file, 100) + RECORD_HEADER_SIZE + 9)
    seg = await _open(path, executor, subs=subs)

    disp = Dispatcher(seg, seg.cursors["a"])
    sink = _Sink()
    consumer = disp.attach("c", None, sink)
    disp.flow(consumer, 1000)
    await _until(lambda: len(sink.items) == 100, "the entries before the damage")
    assert [p for p, _, _ in sink.items] == list(range(100))
    assert sink.corruption is None, "not while it holds unacknowledged entries"
    disp.ack(consumer, [99], cumulative=True)
    await _until(lambda: sink.corruption is not None, "the corruption notice")
    assert sink.corruption is not None and sink.corruption.position == 100
    assert sink.corruption is seg.corruption

    ahead = Dispatcher(seg, seg.cursors["b"])
    other = _Sink()
    ahead.attach("q", None, other)
    await _until(lambda: other.corruption is not None, "the notice for a cursor past the damage")
    assert other.items == []
    await seg.close()


async def test_a_corruption_notice_leaves_a_close_already_asked_for_as_it_was() -> None:
    """The ``position`` of SegmentCorrupted travels with that close only: a connection already
    closing for another reason (its subscription deleted) sends that ERROR frame unchanged."""
    broker = cast(Broker, SimpleNamespace(metrics=BrokerMetrics()))
    conn = ConsumerConnection(broker, cast(web.WebSocketResponse, None), cast(web.Request, None))
    conn.close_soon(wire.ERR_SUBSCRIPTION_NOT_FOUND, "subscription deleted")
    conn.corrupted(Corruption(7, "log-x.log", 0, "checksum mismatch", "read", 0.0))
    assert conn._close == (
        wire.ERR_SUBSCRIPTION_NOT_FOUND,
        "subscription deleted",
        wire.CLOSE_SUBSCRIPTION_NOT_FOUND,
    )
    assert conn._close_extra == {}

    fresh = ConsumerConnection(broker, cast(web.WebSocketResponse, None), cast(web.Request, None))
    fresh.corrupted(Corruption(7, "log-x.log", 0, "checksum mismatch", "read", 0.0))
    assert fresh._close is not None and fresh._close[0] == wire.ERR_SEGMENT_CORRUPTED
    assert fresh._close_extra == {"position": 7}


async def test_corruption_status_is_retried_until_written_and_keeps_the_newest_value() -> None:
    class Api:
        def __init__(self) -> None:
            self.down = True
            self.calls: list[tuple[str, str, int, dict[str, Any] | None]] = []
            self.stored: dict[tuple[str, str, int], dict[str, Any] | None] = {}

        async def write_corruption(
            self, namespace: str, topic: str, segment_id: int, body: dict[str, Any] | None
        ) -> None:
            self.calls.append((namespace, topic, segment_id, body))
            if self.down:
                raise OSError("API server unreachable")
            self.stored[(namespace, topic, segment_id)] = body

    api = Api()
    status = CorruptionStatus(api, first_retry_s=0.01, max_retry_s=0.02)
    status.set(("ns", "t", 0), {"position": 100})
    await _until(lambda: len(api.calls) >= 3, "retries while the API is down")
    assert status.failures >= 3 and status.pending == 1
    status.set(("ns", "t", 0), None)
    api.down = False
    await _until(lambda: status.pending == 0, "the write")
    assert api.stored == {("ns", "t", 0): None}, "the newest value wins"
    await status.close()

"""Pipelined group commit of the segment log: writes overlap syncs, but no entry becomes
visible (acknowledged, delivered) before an ``fdatasync`` covering its bytes has returned.

The log's sync primitive (``storage.log.fdatasync``) is wrapped to record, per file, how many
bytes each *completed* sync covered (the file size when the sync started). A durability
listener then checks every newly visible position against those records.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from scalable_topics.core import wire
from scalable_topics.core.wire import Message
from segment_broker.storage import log as log_module
from segment_broker.storage.log import RECORD_HEADER_SIZE
from segment_broker.storage.segment import Segment, SegmentMeta, StorageSettings

_real_fdatasync = log_module.fdatasync


class SyncRecorder:
    """Replaces the log's ``fdatasync``: records what each completed sync covered; optionally
    holds syncs until released, or fails them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.covered: dict[str, int] = {}
        self.completed = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.fail = False

    def __call__(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        size = os.fstat(fd).st_size
        self.entered.set()
        assert self.release.wait(30), "test never released the sync"
        if self.fail:
            raise OSError(errno.EIO, "injected sync failure")
        _real_fdatasync(fd)
        with self.lock:
            self.covered[path] = max(self.covered.get(path, 0), size)
            self.completed += 1

    def covered_bytes(self, path: Path) -> int:
        with self.lock:
            return self.covered.get(os.path.realpath(path), 0)


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[SyncRecorder]:
    recorder = SyncRecorder()
    monkeypatch.setattr(log_module, "fdatasync", recorder)
    yield recorder
    recorder.release.set()


async def _open(path: Path, executor: ThreadPoolExecutor, **kw: object) -> Segment:
    meta = SegmentMeta("ns", "t", 0, 0, 0xFFFF, 1, 0.0)
    if not (path / "segment.json").exists():
        Segment.create_blocking(path, meta, {"s": "Exclusive"})
    seg = Segment(path, meta, StorageSettings(**kw), executor)  # type: ignore[arg-type]
    await seg.open()
    return seg


def _append(seg: Segment, seq: int, size: int) -> tuple[int, int]:
    """Append one entry; returns ``(position, record size on disk)``."""
    entry = wire.encode_entry("p", seq, [Message(b"x" * size, key=b"k")])
    pos, dup = seg.append(entry, wire.decode_entry_header(entry))
    assert not dup
    return pos, RECORD_HEADER_SIZE + len(entry)


async def _until(cond: Callable[[], bool], what: str) -> None:
    try:
        async with asyncio.timeout(20):
            while not cond():  # noqa: ASYNC110 - state changed by the log's threads
                await asyncio.sleep(0.001)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}")


def _visibility_checker(
    seg: Segment, syncs: SyncRecorder, record_sizes: dict[int, int]
) -> tuple[list[str], Callable[[int], None]]:
    """A durability listener that flags every position made visible before a completed sync
    covered the end of its record (computed independently from the record sizes)."""
    violations: list[str] = []
    checked = [seg.visible_position]

    def on_durable(position: int) -> None:
        for pos in range(checked[0] + 1, position + 1):
            lf = seg.log.file_for(pos)
            assert lf is not None
            end = sum(record_sizes[q] for q in range(lf.base, pos + 1))
            covered = syncs.covered_bytes(lf.path)
            if covered < end:
                violations.append(f"position {pos} visible with {covered}/{end} bytes synced")
        checked[0] = max(checked[0], position)

    return violations, on_durable


@pytest.mark.parametrize("fsync", ["always", "interval"])
async def test_no_entry_is_visible_before_a_sync_covering_it(
    tmp_path: Path, executor: ThreadPoolExecutor, syncs: SyncRecorder, fsync: str
) -> None:
    # interval mode is the negative control: it acknowledges after the write, and with an hour
    # between syncs the checker must catch that.
    seg = await _open(
        tmp_path / "s", executor, fsync=fsync, fsync_interval_ms=3_600_000, roll_bytes=40_000
    )
    record_sizes: dict[int, int] = {}
    violations, checker = _visibility_checker(seg, syncs, record_sizes)
    seg.listeners.add(checker)
    seq = 0
    for burst in range(60):
        for _ in range(1 + burst % 7):
            pos, size = _append(seg, seq, 50 + (seq * 37) % 900)
            record_sizes[pos] = size
            seq += 1
        await asyncio.sleep(0)
    last = seq - 1
    await _until(lambda: seg.visible_position == last, "everything visible")
    if fsync == "always":
        assert violations == []
        assert len(seg.log.files) > 3, "the run should have crossed several rolls"
        assert 1 < syncs.completed <= seq
        assert seg.entries_in == seq
    else:
        assert violations, "acks after the write must be caught by the checker"
    await seg.close()

    # Chunks written before, during and after rolls land in order.
    seg = await _open(tmp_path / "s", executor, fsync=fsync, roll_bytes=40_000)
    stored: list[tuple[int, int]] = []
    while len(stored) < seq:
        got = seg.read(len(stored), 1000, 1 << 30)
        assert got, f"nothing readable at {len(stored)}"
        stored += [(p, wire.decode_entry_header(e).sequence_id) for p, e in got]
    assert stored == [(i, i) for i in range(seq)]
    await seg.close()


async def test_writes_continue_while_a_sync_runs_but_acks_wait_for_it(
    tmp_path: Path, executor: ThreadPoolExecutor, syncs: SyncRecorder
) -> None:
    seg = await _open(tmp_path / "s", executor)
    writer = seg.log.writer
    assert writer is not None
    syncs.release.clear()
    first, _ = _append(seg, 0, 100)
    await _until(syncs.entered.is_set, "the first sync to start")
    second = first
    for seq in range(1, 20):
        second, _ = _append(seg, seq, 100)
    await _until(lambda: writer.written_position == second, "the writer to write while syncing")
    await asyncio.sleep(0.05)
    assert seg.visible_position == -1, "nothing is visible while its sync is held"
    assert seg.in_flight == 20
    syncs.release.set()
    await _until(lambda: seg.visible_position == second, "both syncs to complete")
    assert syncs.completed == 2, "one sync for the first entry, one for the rest"
    await seg.close()


async def test_a_failed_sync_acknowledges_nothing_and_stops_the_segment(
    tmp_path: Path, executor: ThreadPoolExecutor, syncs: SyncRecorder
) -> None:
    seg = await _open(tmp_path / "s", executor)
    sealed_calls: list[bool] = []
    seg.seal_listeners.add(lambda: sealed_calls.append(seg.failed))
    syncs.fail = True
    _append(seg, 0, 100)
    async with asyncio.timeout(20):
        await seg.wait_flushed()
    assert seg.failed and seg.visible_position == -1
    assert sealed_calls == [True], "connections are told to close"
    await seg.close()


async def test_interval_mode_acks_after_write_and_syncs_periodically(
    tmp_path: Path, executor: ThreadPoolExecutor, syncs: SyncRecorder
) -> None:
    seg = await _open(tmp_path / "s", executor, fsync="interval", fsync_interval_ms=1000)
    started = time.monotonic()
    for seq in range(30):
        _append(seg, seq, 100)
        await asyncio.sleep(0)
    await _until(lambda: seg.visible_position == 29, "acks after the write")
    elapsed = time.monotonic() - started
    assert syncs.completed <= 1 + elapsed, "one sync per interval, not one per write"
    await _until(lambda: seg.log.durable_position == 29, "the periodic sync")
    assert seg.fsyncs >= 1
    await seg.close()


@pytest.mark.parametrize("fsync", ["always", "interval"])
async def test_commit_stages_are_timed_per_chunk_and_a_slow_sync_shows_in_sync(
    tmp_path: Path, executor: ThreadPoolExecutor, syncs: SyncRecorder, fsync: str
) -> None:
    """Each chunk is reported once per stage of the group commit; time spent in a held sync is
    attributed to ``sync`` (always mode), not to ``write`` or ``visible``; interval mode has no
    sync on the ack path and reports none."""
    seen: list[tuple[str, float]] = []
    seg = await _open(tmp_path / "s", executor, fsync=fsync, fsync_interval_ms=3_600_000)
    seg.on_stage = lambda stage, seconds: seen.append((stage, seconds))
    hold = 0.08
    syncs.release.clear()
    _append(seg, 0, 100)
    if fsync == "always":
        await _until(syncs.entered.is_set, "the first sync to start")
        await asyncio.sleep(hold)
    syncs.release.set()
    await _until(lambda: seg.visible_position == 0, "the first chunk visible")
    for seq in range(1, 6):
        _append(seg, seq, 100)
        await _until(lambda seq=seq: seg.visible_position == seq, f"chunk {seq} visible")  # type: ignore[misc]
    by_stage: dict[str, list[float]] = {}
    for stage, seconds in seen:
        assert seconds >= 0, (stage, seconds)
        by_stage.setdefault(stage, []).append(seconds)
    if fsync == "always":
        assert sorted(by_stage) == ["stage", "sync", "visible", "write"]
        assert all(len(v) == 6 for v in by_stage.values()), by_stage
        assert by_stage["sync"][0] >= hold, by_stage
        assert by_stage["write"][0] < hold and by_stage["visible"][0] < hold, by_stage
    else:
        assert sorted(by_stage) == ["stage", "visible", "write"]
        assert all(len(v) == 6 for v in by_stage.values()), by_stage
    await seg.close()


async def test_a_segment_never_written_to_holds_no_threads(
    tmp_path: Path, executor: ThreadPoolExecutor, syncs: SyncRecorder
) -> None:
    """The writer and syncer threads start with the first write: idle segments (most of a
    cluster with many topics) hold none; a close stops the threads that did start."""

    def names() -> set[str]:
        return {t.name for t in threading.enumerate()}

    idle = await _open(tmp_path / "idle", executor)
    busy = await _open(tmp_path / "busy", executor)
    assert not {n for n in names() if n.endswith((" idle", " busy"))}
    _append(busy, 0, 100)
    await _until(lambda: busy.visible_position == 0, "the first entry durable")
    assert {"log-write busy", "log-sync busy"} <= names()
    assert not {n for n in names() if n.endswith(" idle")}
    await idle.close()
    await busy.close()
    assert not {n for n in names() if n.endswith((" idle", " busy"))}
    reopened = await _open(tmp_path / "busy", executor)
    assert reopened.log.next_position == 1
    await reopened.close()


async def test_close_waits_for_the_rolls_index_writes_so_a_reopen_never_races_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A roll writes the filled file's index in the background. ``close`` waits for it: a
    reopen of the directory (a truncation, a transfer, a test) writes the same ``.idx.tmp``,
    and one replace then found the other's file gone (CI: FileNotFoundError in ``open``).
    The index write is held until a timer releases it, on an executor with threads to spare:
    the log is closed after the index is written, never while it is."""
    order: list[str] = []
    entered = threading.Event()
    release = threading.Event()
    real_index = log_module.SegmentLog.write_index_blocking
    real_close = log_module.SegmentLog.close

    def held_index(self: log_module.SegmentLog, lf: log_module.LogFile) -> None:
        entered.set()
        assert release.wait(30), "the test never released the index write"
        real_index(self, lf)
        order.append("index")

    def recorded_close(self: log_module.SegmentLog, *, sync: bool = True) -> None:
        order.append("log closed")
        real_close(self, sync=sync)

    monkeypatch.setattr(log_module.SegmentLog, "write_index_blocking", held_index)
    monkeypatch.setattr(log_module.SegmentLog, "close", recorded_close)
    with ThreadPoolExecutor(4) as executor:
        seg = await _open(tmp_path / "s", executor, roll_bytes=4_000)
        for seq in range(20):
            _append(seg, seq, 500)
        await _until(lambda: entered.is_set(), "a roll's index write")
        threading.Timer(0.3, release.set).start()
        await seg.close()
        assert order[:2] == ["index", "log closed"], order
        monkeypatch.undo()
        reopened = await _open(tmp_path / "s", executor, roll_bytes=4_000)
        assert reopened.log.next_position == 20
        await reopened.close()

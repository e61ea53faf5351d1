"""One segment: its log, cursors, seal state, producer deduplication and group commit.

Directory layout (``<data-dir>/<namespace>/<topic>/<descriptor>/``)::

    segment.json          identity and settings (written once, atomically)
    log-<base>.log/.idx   the log (see storage.log)
    dedup-<base>.json     producer dedup table for positions below <base>, written at each roll
    cursors/<sub>.json    one cursor per subscription
    sealed.json           the termination marker (lastPosition, successors, children it opened)
    fenced.json           present while the segment does not accept writes yet (a split or
                          merge child between its creation and its parents' seal)

Group commit: :meth:`Segment.append` stages an entry in memory; once per event-loop pass the
staged entries go to the log's writer thread as one chunk, and a syncer thread runs
``fdatasync`` over everything written so far (``storage.log.LogWriter``), so writing the next
chunks overlaps with syncing the previous ones. When a sync completes, the event loop advances
``visible_position`` to the last position it covered and calls the durability listeners
(producer connections send their acks, dispatchers push to consumers). With
``fsync="interval"`` entries become visible once written and the syncer runs every
``fsync_interval_ms`` (an explicit, weaker option: a machine crash loses the last interval).

Beside this module: the records (:mod:`.meta`), the refusals (:mod:`.errors`), producer
de-duplication (:mod:`.dedup`), the in-memory entry cache (:mod:`.cache`), what retention lets
go (:mod:`.retention`), the log files (:mod:`.log`) and the cursors (:mod:`.cursor`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from scalable_topics.core.subscriptions import BrokerSubscriptionType
from scalable_topics.core.wire import EntryHeader

from . import dedup
from .cache import EntryCache
from .cursor import Cursor
from .dedup import ProducerState
from .errors import (
    SegmentCorruptedError,
    SegmentGoneError,
    SegmentNotWritableError,
    SegmentReleasingError,
    SegmentSealedError,
)
from .fsutil import atomic_write_json, fsync_dir, read_json
from .log import (
    Corruption,
    LogFile,
    LogWriter,
    RecoveryReport,
    SegmentLog,
    TruncateReport,
)
from .meta import (
    FENCE_FILE,
    SUBSCRIPTION_NAME,
    FsyncMode,
    Retention,
    SealInfo,
    SegmentMeta,
    StorageSettings,
)
from .retention import beyond_retention

__all__ = [
    "FENCE_FILE",
    "SUBSCRIPTION_NAME",
    "DurableListener",
    "FsyncMode",
    "ProducerState",
    "Retention",
    "SealInfo",
    "Segment",
    "SegmentCorruptedError",
    "SegmentGoneError",
    "SegmentMeta",
    "SegmentNotWritableError",
    "SegmentReleasingError",
    "SegmentSealedError",
    "StorageSettings",
]

log = logging.getLogger(__name__)

_MSG_COUNT = struct.Struct("<I")
_OFF_MSG_COUNT = 18


DurableListener = Callable[[int], None]
StageObserver = Callable[[str, float], None]
"""``(stage, seconds)``: how long a chunk of staged entries spent in one stage of the group
commit (:data:`COMMIT_STAGES`)."""

COMMIT_STAGES = ("stage", "write", "sync", "visible")
"""The group commit's stages, each measured per chunk (what one event-loop pass staged):
``stage`` first entry staged → chunk handed to the writer thread (the rest of the loop pass);
``write`` handed over → written (the writer's queue and ``writev``); ``sync`` written → covered
by a completed ``fdatasync`` (waiting for the syncer, then the sync); ``visible`` synced → the
event loop marks it visible and calls the listeners (the thread-to-loop handoff)."""


class Segment:
    """A hosted segment. All methods run on the event loop; blocking I/O goes to ``executor``."""

    def __init__(
        self,
        directory: Path,
        meta: SegmentMeta,
        settings: StorageSettings,
        executor: Executor,
        *,
        on_fsync: Callable[[float], None] | None = None,
        on_durable_entries: Callable[[list[tuple[int, int, int | None]]], None] | None = None,
        on_stage: StageObserver | None = None,
    ) -> None:
        self.directory = directory
        self.meta = meta
        self.settings = settings
        self.executor = executor
        self.log = SegmentLog(
            directory, roll_bytes=settings.roll_bytes, index_interval=settings.index_interval
        )
        self.cursors: dict[str, Cursor] = {}
        self._cursor_io = threading.Lock()
        """Serialises cursor file writes: a cancelled persist task's thread may still run."""
        self.seal: SealInfo | None = None
        self.sealing = False
        self.failed = False
        """A log write failed: nothing more is accepted or acknowledged; connections close."""
        self.sealed_event = asyncio.Event()
        self.writable_event = asyncio.Event()
        """Set once the segment accepts writes (created writable, or activated)."""
        self.writable_event.set()
        self.fence_reason: str | None = None
        """Why a fenced segment is fenced: ``None`` (a split or merge child), ``"incoming"``
        (a transfer's copy on its destination) or ``"releasing"`` (a transfer's source)."""
        self._terminating: asyncio.Future[SealInfo] | None = None
        self.closed = False
        self._finishing: set[asyncio.Future[None]] = set()
        """Roll finishers (index, dedup snapshot) still running in the executor."""
        self.producers: dict[str, ProducerState] = {}
        self.visible_position = -1
        """Last position that producers have been acknowledged for and consumers may read."""
        self.listeners: set[DurableListener] = set()
        self.seal_listeners: set[Callable[[], None]] = set()
        self.corruption_listeners: set[Callable[[Corruption], object]] = set()
        """Called once when a read finds the log damaged (recovery's finding is in ``recovery``)."""
        self.on_fsync = on_fsync
        self.on_durable_entries = on_durable_entries
        self.on_stage = on_stage
        self.visible_at = 0.0
        """``time.perf_counter()`` when ``visible_position`` last advanced."""
        self._staged_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer: LogWriter | None = None
        self._submit_scheduled = False
        self._progress = asyncio.Event()
        """Set whenever ``visible_position`` advances or the log fails."""
        self._housekeeping: asyncio.Task[None] | None = None
        self.on_due: Callable[[Segment], object] | None = None
        """Called when a cursor changed or the log rolled: the segment has housekeeping to do
        (:meth:`housekeep`; the store then calls it at its next round)."""
        self._pending_load: list[tuple[int, int, int | None]] = []
        self._chunks: deque[tuple[int, list[tuple[int, int, int | None]], float, float]] = deque()
        """Submitted, not yet visible chunks: ``(last position, per-entry load, first entry
        staged at, submitted at)``."""
        self._written_at: deque[tuple[int, float]] = deque()
        self._synced_at: deque[tuple[int, float]] = deque()
        self._rolls: deque[tuple[LogFile, int, dict[str, tuple[int, int]]]] = deque()
        """Queued rolls: ``(filled file, next base, dedup snapshot below it)``."""
        self.cache = EntryCache(settings.cache_bytes)
        self.recovery: RecoveryReport | None = None
        self.entries_in = 0
        self.messages_in = 0
        self.bytes_in = 0
        self.entries_out = 0
        self.messages_out = 0
        self.bytes_out = 0
        self.duplicates = 0
        self.fsyncs = 0
        self.ignored_while_releasing = 0
        """Entries a transfer's fence kept from being stored (their producers re-send them)."""

    # --- lifecycle -----------------------------------------------------------------------------

    @classmethod
    def create_blocking(
        cls,
        directory: Path,
        meta: SegmentMeta,
        subs: dict[str, str],
        *,
        writable: bool = True,
        fence_reason: str | None = None,
    ) -> None:
        """Create the directory, fence marker, initial cursors (position 0) and, last, the
        identity file durably: a segment found on recovery has everything written before it."""
        (directory / "cursors").mkdir(parents=True, exist_ok=True)
        if writable:
            (directory / FENCE_FILE).unlink(missing_ok=True)
        else:
            marker: dict[str, Any] = {"fencedAt": time.time()}
            if fence_reason is not None:
                marker["reason"] = fence_reason
            atomic_write_json(directory / FENCE_FILE, marker)
        for name, sub_type in subs.items():
            cur = Cursor(name=name, type=BrokerSubscriptionType.parse(sub_type))
            atomic_write_json(directory / "cursors" / f"{name}.json", cur.to_json())
        atomic_write_json(directory / "segment.json", meta.to_json())
        fsync_dir(directory.parent)

    async def open(self) -> RecoveryReport:
        loop = asyncio.get_running_loop()
        report, fenced, fence_reason = await loop.run_in_executor(
            self.executor, self._open_blocking
        )
        self.recovery = report
        if self.seal is not None:
            self.sealed_event.set()
        if fenced:
            self.writable_event.clear()
            self.fence_reason = fence_reason
        self.visible_position = self.log.durable_position
        self.cache.base = self.log.next_position
        self._loop = loop
        self._writer = self.log.start_writer(
            sync_each=self.settings.fsync == "always",
            interval_s=self.settings.fsync_interval_ms / 1000.0,
            notify=lambda: loop.call_soon_threadsafe(self._on_progress),
            page_cache_bytes=self.settings.page_cache_bytes,
        )
        return report

    def _open_blocking(self) -> tuple[RecoveryReport, bool, str | None]:
        """Recover the log, cursors, seal and dedup table; also says whether the segment is
        fenced (the event it clears belongs to the loop, not to this thread)."""
        report = self.log.open()
        cursor_dir = self.directory / "cursors"
        cursor_dir.mkdir(exist_ok=True)
        for path in sorted(cursor_dir.glob("*.json")):
            cur = Cursor.from_json(read_json(path))
            cur.on_touch = self._became_due
            self.cursors[cur.name] = cur
        for stale in cursor_dir.glob("*.tmp"):
            stale.unlink()
        sealed = self.directory / "sealed.json"
        if sealed.exists():
            self.seal = SealInfo.from_json(read_json(sealed))
        dedup.rebuild(self.directory, self.log, self.producers, self.name)
        fence = self.directory / FENCE_FILE
        if not fence.exists():
            return report, False, None
        reason = read_json(fence).get("reason")
        return report, True, reason if isinstance(reason, str) else None

    @property
    def cache_limit(self) -> int:
        """Bytes of recent entries kept in memory; the store shares its budget among segments."""
        return self.cache.limit

    @cache_limit.setter
    def cache_limit(self, value: int) -> None:
        self.cache.limit = value

    @property
    def name(self) -> str:
        return f"{self.meta.namespace}/{self.meta.topic}/{self.meta.descriptor}"

    async def close(self) -> None:
        """Flush what is staged, persist cursors, stop the background tasks."""
        if self.closed:
            return
        await self.wait_flushed()
        self.closed = True
        await self._stop_housekeeping()
        await self.persist_cursors()
        await self._roll_finishers()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.executor, lambda: self.log.close(sync=not self.failed))

    async def _roll_finishers(self) -> None:
        """Wait for the rolls' index and snapshot writes: one still running after a close
        would race a reopen of the same directory (a truncation, a transfer) writing the same
        ``.idx.tmp``, and fail it (found by test_broker_storage_pipeline under CI load)."""
        if self._finishing:
            await asyncio.gather(*list(self._finishing), return_exceptions=True)

    async def destroy(self) -> None:
        """Delete the segment and its data."""
        self.closed = True
        self._progress.set()
        await self._stop_housekeeping()
        await self._roll_finishers()
        loop = asyncio.get_running_loop()

        def rm() -> None:
            self.log.close(sync=False)
            shutil.rmtree(self.directory, ignore_errors=True)
            with contextlib.suppress(OSError):
                fsync_dir(self.directory.parent)

        await loop.run_in_executor(self.executor, rm)

    # --- produce -------------------------------------------------------------------------------

    def append(
        self, entry: bytes | memoryview, header: EntryHeader, *, copying: bool = False
    ) -> tuple[int, bool]:
        """Stage an entry. Returns ``(position, duplicate)``. ``copying``: an entry of a
        transfer's source copied into this fenced copy (the fence does not refuse it).

        A duplicate (sequence id not above the producer's last stored one) is not written; its
        position is the original one, or -1 when it is older than the retained history.
        """
        if self.closed:
            raise SegmentGoneError(self.name)
        st = self.producers.get(header.producer_name)
        seq = header.sequence_id
        if st is not None and seq <= st.last_seq:
            self.duplicates += 1
            return st.lookup(seq), True
        if self.seal is not None or self.sealing:
            raise SegmentSealedError(self.seal)
        if self.log.corruption is not None:
            raise SegmentCorruptedError(self.name, self.log.corruption)
        if not self.writable_event.is_set() and not copying:
            if self.fence_reason == "releasing":
                self.ignored_while_releasing += 1
                raise SegmentReleasingError(self.name)
            raise SegmentNotWritableError(self.name)
        pos = self.log.stage(entry)
        if st is None:
            self.producers[header.producer_name] = st = ProducerState()
        st.record(seq, pos)
        self.cache.add(entry, self.visible_position)
        self._pending_load.append((header.message_count, len(entry), header.key_hash_sample))
        if not self._submit_scheduled and self._loop is not None:
            self._submit_scheduled = True
            self._staged_at = time.perf_counter()
            self._loop.call_soon(self._submit)
        return pos, False

    def last_sequence_id(self, producer_name: str) -> int:
        st = self.producers.get(producer_name)
        return st.last_seq if st is not None else -1

    def _submit(self) -> None:
        """Hand everything staged during this event-loop pass to the writer as one chunk."""
        self._submit_scheduled = False
        lg = self.log
        writer = self._writer
        if not lg.has_pending or writer is None or self.failed:
            return
        loads = self._pending_load
        self._pending_load = []
        data, last, filled = lg.commit_chunk()
        self._chunks.append((last, loads, self._staged_at, time.perf_counter()))
        writer.submit_write(data, last)
        if filled is not None:
            base = filled.next_position
            snapshot = dedup.snapshot_below(self.producers, base)
            self._rolls.append((filled, base, snapshot))
            writer.submit_roll(lg.files[-1].path)

    def _on_progress(self) -> None:
        """Event loop: the writer threads reported a write, sync, roll or failure."""
        writer = self._writer
        if writer is None:
            return
        progress = writer.take()
        for elapsed in progress.sync_durations:
            self.fsyncs += 1
            if self.on_fsync is not None:
                self.on_fsync(elapsed)
        for _ in range(progress.rolls):
            self._finish_roll(*self._rolls.popleft())
        lg = self.log
        lg.mark_written(progress.written)
        lg.mark_durable(progress.synced)
        observe = self.on_stage
        if observe is not None:
            self._written_at.extend(progress.written_at)
            if self.settings.fsync == "always":
                self._synced_at.extend(progress.synced_at)
        error = progress.error
        target = progress.synced if self.settings.fsync == "always" else progress.written
        if target > self.visible_position and not self.failed:
            loads: list[tuple[int, int, int | None]] = []
            chunks = self._chunks
            now = time.perf_counter()
            while chunks and chunks[0][0] <= target:
                last, chunk_loads, staged_at, submitted_at = chunks.popleft()
                loads.extend(chunk_loads)
                if observe is not None:
                    self._observe_stages(observe, last, staged_at, submitted_at, now)
            self.visible_position = target
            self.visible_at = now
            self.entries_in += len(loads)
            for count, nbytes, _ in loads:
                self.messages_in += count
                self.bytes_in += nbytes
            if self.on_durable_entries is not None:
                self.on_durable_entries(loads)
            for listener in list(self.listeners):
                listener(target)
            self._progress.set()
        if error is not None and not self.failed:
            log.error("%s: log I/O failed (%s); the segment stops accepting", self.name, error)
            self.closed = True
            self.failed = True
            self._progress.set()
            for cb in list(self.seal_listeners):
                cb()

    def _observe_stages(
        self, observe: StageObserver, last: int, staged_at: float, submitted_at: float, now: float
    ) -> None:
        """Report one chunk's time in each stage; the writer's marks below it are dropped."""
        written_at = self._first_mark(self._written_at, last)
        observe("stage", submitted_at - staged_at)
        if written_at is None:
            return
        observe("write", written_at - submitted_at)
        if self.settings.fsync != "always":
            observe("visible", now - written_at)
            return
        synced_at = self._first_mark(self._synced_at, last)
        if synced_at is None:
            return
        observe("sync", synced_at - written_at)
        observe("visible", now - synced_at)

    @staticmethod
    def _first_mark(marks: deque[tuple[int, float]], position: int) -> float | None:
        """The time of the first mark covering ``position`` (older marks are discarded)."""
        while marks and marks[0][0] < position:
            marks.popleft()
        return marks[0][1] if marks else None

    def _finish_roll(self, old: LogFile, base: int, snapshot: dict[str, tuple[int, int]]) -> None:
        """After the writer switched files: write the filled file's index and the dedup
        snapshot in the background (both can be rebuilt, so nothing waits for them)."""
        self._became_due()

        def finish() -> None:
            atomic_write_json(dedup.snapshot_path(self.directory, base), snapshot)
            self.log.write_index_blocking(old)

        try:
            task = asyncio.get_running_loop().run_in_executor(self.executor, finish)
        except RuntimeError:
            log.warning(
                "%s: shutting down; the index of %s is rebuilt at the next start",
                self.name,
                old.path.name,
            )
            return
        self._finishing.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, fut: asyncio.Future[None]) -> None:
        self._finishing.discard(fut)
        if not fut.cancelled() and fut.exception() is not None:
            log.error(
                "%s: writing a roll's index or dedup snapshot failed: %s",
                self.name,
                fut.exception(),
            )

    async def wait_flushed(self) -> None:
        """Return once everything staged so far is acknowledgeable (or the log failed)."""
        target = self.log.next_position - 1
        while (
            self.visible_position < target
            and not self.failed
            and not self.closed
            and self._writer is not None
        ):
            if self.log.has_pending and not self._submit_scheduled:
                self._submit()
            self._progress.clear()
            await self._progress.wait()

    @property
    def in_flight(self) -> int:
        """Entries staged or being flushed, not yet acknowledged."""
        return self.log.next_position - 1 - self.visible_position

    # --- seal ----------------------------------------------------------------------------------

    async def terminate(
        self,
        successors: list[dict[str, Any]],
        *,
        open_after: Sequence[int] = (),
        on_begin: Callable[[], object] | None = None,
    ) -> SealInfo:
        """Seal the segment (idempotent; concurrent calls share one seal).

        New appends are refused from the first moment; everything staged before is flushed and
        acknowledged; then the marker is made durable. Producers refused meanwhile wait for the
        marker before they are told the successors, so nobody is redirected to the successors
        while the parent could still come back unsealed after a crash. ``on_begin`` is called
        when this call starts an attempt (not when the segment is sealed, being sealed or
        corrupted), before anything is written. ``open_after``: successors hosted beside this
        segment that the caller opens after the seal; the marker names them
        (:attr:`SealInfo.open`), which makes their opening durable with it.
        """
        if self.seal is not None:
            return self.seal
        if self._terminating is not None:
            return await asyncio.shield(self._terminating)
        if self.log.corruption is not None:
            # A seal would end the segment before the damage and let consumers move on to the
            # successors: the corrupted entries would be skipped without anyone deciding it.
            raise SegmentCorruptedError(self.name, self.log.corruption)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[SealInfo] = loop.create_future()
        self._terminating = fut
        self.sealing = True
        if on_begin is not None:
            on_begin()
        try:
            await self.wait_flushed()
            info = SealInfo(self.log.next_position - 1, successors, time.time(), tuple(open_after))
            await loop.run_in_executor(
                self.executor, atomic_write_json, self.directory / "sealed.json", info.to_marker()
            )
        except BaseException as exc:
            self.sealing = False
            self._terminating = None
            fut.set_exception(exc)
            fut.exception()
            raise
        self.seal = info
        self.sealed_event.set()
        fut.set_result(info)
        for cb in list(self.seal_listeners):
            cb()
        return info

    async def seal_settled(self) -> bool:
        """Wait for the seal in progress: ``True`` once the segment is sealed, ``False`` when
        the attempt failed (or none is running), so that what was refused meanwhile is sent
        again instead of waiting for a seal that does not come."""
        attempt = self._terminating
        if self.seal is None and attempt is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(attempt)
        return self.seal is not None

    async def adopt_seal(self, info: SealInfo) -> None:
        """Take the seal of the copy this one was made from (an ownership transfer): the same
        last position, successors and time, made durable before anyone is told."""
        if self.seal is not None:
            return
        if info.last_position != self.log.next_position - 1:
            raise ValueError(
                f"{self.name}: seal at {info.last_position}, log ends at "
                f"{self.log.next_position - 1}"
            )
        await self.wait_flushed()
        await asyncio.get_running_loop().run_in_executor(
            self.executor, atomic_write_json, self.directory / "sealed.json", info.to_json()
        )
        self.seal = info
        self.sealed_event.set()
        for cb in list(self.seal_listeners):
            cb()

    @property
    def sealed(self) -> bool:
        return self.seal is not None

    @property
    def writable(self) -> bool:
        """Not fenced (a sealed segment stays "writable" in this sense; appends still fail)."""
        return self.writable_event.is_set()

    async def activate(self, *, durable: bool = True) -> None:
        """Lift the fence (idempotent): remove the marker durably, then accept writes.

        ``durable=False`` is for a child its parent's seal opens (``SealInfo.open``): the seal,
        already durable, is the record, so the marker goes without waiting for the disk and a
        recovery that finds it anyway opens the child again (``SegmentStore.open``). That
        takes a directory fsync and a thread hand-off out of the split's blocked window."""
        if self.writable_event.is_set():
            return
        marker = self.directory / FENCE_FILE

        def unfence() -> None:
            marker.unlink(missing_ok=True)
            fsync_dir(self.directory)

        if durable:
            await asyncio.get_running_loop().run_in_executor(self.executor, unfence)
        else:
            marker.unlink(missing_ok=True)
        self.fence_reason = None
        self.writable_event.set()

    async def fence(self, reason: str) -> None:
        """Stop accepting writes for an ownership transfer, durably (the marker names
        ``reason``, so a restart keeps the fence and its kind); idempotent. Everything staged
        before is flushed (and so acknowledged) before this returns."""
        self.fence_reason = reason
        self.writable_event.clear()
        body = {"fencedAt": time.time(), "reason": reason}
        await asyncio.get_running_loop().run_in_executor(
            self.executor, atomic_write_json, self.directory / FENCE_FILE, body
        )
        await self.wait_flushed()

    async def truncate(self, position: int) -> TruncateReport:
        """Lift the quarantine: cut the log at ``position``, its first damaged record, for an
        operator who acknowledged losing every entry from there on. Closes the segment; the
        caller opens it again (recovery then verifies what is left).

        Cursors past ``position`` come back to it (those positions are written anew) and a
        seal beyond it moves to ``position - 1``; both are written before the log is cut, so a
        crash in between finds the segment still quarantined, never a cursor beyond its end.
        """
        corruption = self.log.corruption
        if corruption is None or corruption.position != position:
            raise ValueError(f"segment {self.name} is not corrupted at position {position}")
        await self.close()
        return await asyncio.get_running_loop().run_in_executor(
            self.executor, self._truncate_blocking, position
        )

    def _truncate_blocking(self, position: int) -> TruncateReport:
        with self._cursor_io:
            for cur in self.cursors.values():
                if cur.truncate(position):
                    atomic_write_json(self._cursor_path(cur.name), cur.to_json())
        if self.seal is not None and self.seal.last_position >= position:
            self.seal = dataclasses.replace(self.seal, last_position=position - 1)
            atomic_write_json(self.directory / "sealed.json", self.seal.to_marker())
        dedup.drop_snapshots_above(self.directory, position)
        fsync_dir(self.directory)
        return self.log.truncate_blocking(position)

    # --- reading -------------------------------------------------------------------------------

    @property
    def corruption(self) -> Corruption | None:
        return self.log.corruption

    @property
    def servable_position(self) -> int:
        """The last position a consumer can get: ``visible_position``, or the one before the
        first damaged record of a quarantined segment."""
        corruption = self.log.corruption
        if corruption is None:
            return self.visible_position
        return min(self.visible_position, corruption.position - 1)

    def read(self, position: int, max_entries: int, max_bytes: int) -> list[tuple[int, Any]]:
        """Acknowledged entries from ``position`` on: from the memory cache when recent,
        otherwise from the log files (page cache). Never at or beyond a damaged record."""
        last = self.servable_position
        if position > last:
            return []
        if position >= self.cache.base:
            return self.cache.read(position, last, max_entries, max_bytes)
        if position < self.log.first_position:
            return []
        known = self.log.corruption
        got = self.log.read(
            position, min(max_entries, self.cache.base - position, last + 1 - position), max_bytes
        )
        found = self.log.corruption
        if found is not None and found is not known:
            for cb in list(self.corruption_listeners):
                cb(found)
        return got

    def read_one(self, position: int) -> Any | None:
        got = self.read(position, 1, 1)
        return got[0][1] if got and got[0][0] == position else None

    @staticmethod
    def message_count(entry: bytes | memoryview) -> int:
        count: int = _MSG_COUNT.unpack_from(entry, _OFF_MSG_COUNT)[0]
        return count

    # --- cursors -------------------------------------------------------------------------------

    async def add_cursor(self, name: str, sub_type: BrokerSubscriptionType, at_end: bool) -> Cursor:
        existing = self.cursors.get(name)
        if existing is not None:
            if existing.type != sub_type:
                raise ValueError(
                    f"subscription {name!r} exists with type {existing.type.value}, "
                    f"not {sub_type.value}"
                )
            return existing
        cur = Cursor(name=name, type=sub_type, on_touch=self._became_due)
        if at_end:
            cur.ack_floor = self.log.next_position
        self.cursors[name] = cur
        loop = asyncio.get_running_loop()
        body = cur.to_json()

        def write() -> None:
            with self._cursor_io:
                atomic_write_json(self._cursor_path(name), body)

        await loop.run_in_executor(self.executor, write)
        cur.dirty = False
        return cur

    async def remove_cursor(self, name: str) -> bool:
        if self.cursors.pop(name, None) is None:
            return False
        loop = asyncio.get_running_loop()

        def rm() -> None:
            with self._cursor_io:
                self._cursor_path(name).unlink(missing_ok=True)
                fsync_dir(self.directory / "cursors")

        await loop.run_in_executor(self.executor, rm)
        return True

    def _cursor_path(self, name: str) -> Path:
        return self.directory / "cursors" / f"{name}.json"

    async def persist_cursors(self) -> None:
        dirty = [(c, c.version, c.to_json()) for c in self.cursors.values() if c.dirty]
        if not dirty:
            return
        loop = asyncio.get_running_loop()

        def write() -> None:
            with self._cursor_io:
                for cur, _, body in dirty:
                    if self.cursors.get(cur.name) is cur:
                        atomic_write_json(self._cursor_path(cur.name), body)

        await loop.run_in_executor(self.executor, write)
        for cur, version, _ in dirty:
            if cur.version == version:
                cur.dirty = False

    def _became_due(self) -> None:
        if self.on_due is not None:
            self.on_due(self)

    def housekeep(self) -> None:
        """Persist changed cursors and apply retention in the background, when either may have
        work and the previous round is over. The store calls it every ``cursor_flush_ms`` for
        the segments that said they are due (:attr:`on_due`) and once a second for all (time
        retention); an idle segment costs nothing in between. (A task per segment waking ten
        times a second made 7,000 idle segments a fifth of a core.)"""
        if self.closed or (self._housekeeping is not None and not self._housekeeping.done()):
            return
        cursors = self.cursors.values()
        if not any(c.dirty for c in cursors) and not (len(self.log.files) > 1 and cursors):
            return
        self._housekeeping = asyncio.get_running_loop().create_task(
            self._housekeep(), name=f"housekeeping {self.name}"
        )

    async def _housekeep(self) -> None:
        try:
            await self.persist_cursors()
            await self.apply_retention()
        except OSError:
            log.exception("%s: cursor persistence failed", self.name)

    async def _stop_housekeeping(self) -> None:
        task = self._housekeeping
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def backlog(self, cursor: Cursor) -> int:
        return cursor.backlog(self.visible_position + 1)

    def drained(self, cursor: Cursor) -> bool:
        """Sealed and every entry up to the termination marker acknowledged."""
        return self.seal is not None and cursor.ack_floor > self.seal.last_position

    # --- retention -----------------------------------------------------------------------------

    async def apply_retention(self) -> int:
        """Delete whole rolled files below every cursor and outside the retention policy
        (never while the segment is quarantined: its data stays as it was found)."""
        if not self.cursors or len(self.log.files) < 2 or self.log.corruption is not None:
            return 0
        floor = min(c.ack_floor for c in self.cursors.values())
        candidates = self.log.deletable_files(floor)
        candidates = beyond_retention(candidates, self.meta.retention, self.log.total_bytes)
        if not candidates:
            return 0
        self.log.drop_files(candidates)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.executor, self.log.delete_files_blocking, candidates)
        return len(candidates)

"""Append-only segment log: framed, checksummed files with a sparse index and group commit.

On disk a segment's log is a sequence of files ``log-<base>.log`` where ``<base>`` (20 digits) is
the position of the file's first entry. Each record is::

    u32 length | u32 crc32c(entry) | i64 position | entry bytes (length bytes)

A *position* is the index of the entry in the segment: 0, 1, 2, … with no gaps, across files.
Files roll once they reach ``roll_bytes``. A sparse index ``log-<base>.idx`` (pairs of i64
position, u64 file offset, one every ``index_interval`` bytes) is written when a file is rolled
and rebuilt by scanning otherwise.

Durability: :meth:`SegmentLog.stage` only buffers; :meth:`SegmentLog.commit_chunk` hands what was
staged to the segment's :class:`LogWriter`, which pipelines writing and syncing in two dedicated
threads: the *writer* appends chunks as they arrive while the *syncer* runs ``fdatasync`` over
everything written up to the moment it starts (group commit). ``synced_position`` is the last
position covered by a completed ``fdatasync``; with ``fsync=always`` nothing above it is
acknowledged. Rolling to a new file happens in the writer between two chunks: the old file is
synced, the new one created and its directory entry synced before anything is written to it.

Recovery scans the last file record by record and truncates it at the first record that is
short, fails its checksum or has an unexpected position (a torn tail after a crash). Nothing that
was acknowledged can be lost that way: an acknowledgement is only sent after its sync returned.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from .fsutil import fsync_dir

log = logging.getLogger(__name__)

RECORD_HEADER = struct.Struct("<IIq")
RECORD_HEADER_SIZE = RECORD_HEADER.size
INDEX_ITEM = struct.Struct("<qQ")
MAX_RECORD = 64 * 1024 * 1024
_LOG_NAME = re.compile(r"^log-(\d{20})\.log$")
_READ_CHUNK = 64 * 1024
_READ_MAX = 8 * 1024 * 1024
_WRITE_SLICE = 2 * 1024 * 1024
"""Bytes per ``writev``: the writer publishes progress at least this often, so the syncer can
start on the first part of a large backlog while the rest is still being written."""
_IOV_MAX = 1024

fdatasync: Callable[[int], None] = os.fdatasync
"""The sync primitive of the log (module-level so that tests can observe every sync)."""


def log_name(base: int) -> str:
    return f"log-{base:020d}.log"


def index_name(base: int) -> str:
    return f"log-{base:020d}.idx"


@dataclass
class LogFile:
    base: int
    path: Path
    size: int = 0
    next_position: int = 0
    index_positions: list[int] = field(default_factory=list)
    index_offsets: list[int] = field(default_factory=list)

    @property
    def last_position(self) -> int:
        return self.next_position - 1

    def add_index(self, position: int, offset: int) -> None:
        self.index_positions.append(position)
        self.index_offsets.append(offset)

    def seek_hint(self, position: int) -> int:
        """File offset of the last indexed record at or before ``position``."""
        i = bisect.bisect_right(self.index_positions, position) - 1
        return self.index_offsets[i] if i >= 0 else 0


@dataclass(frozen=True)
class RecoveryReport:
    next_position: int
    truncated_bytes: int
    truncated_file: str | None


class CorruptLogError(RuntimeError):
    """A non-final log file is damaged: data that may have been acknowledged is unreadable."""


def scan_records(data: bytes | memoryview, start_offset: int = 0) -> Iterator[tuple[int, int, int]]:
    """Yield ``(position, record_offset, entry_length)`` of every intact record in ``data``.

    Stops silently at the first incomplete or corrupt record; the caller compares the final
    offset with the length to detect a torn tail.
    """
    buf = memoryview(data)
    size = len(buf)
    off = start_offset
    while off + RECORD_HEADER_SIZE <= size:
        length, crc, pos = RECORD_HEADER.unpack_from(buf, off)
        end = off + RECORD_HEADER_SIZE + length
        if length > MAX_RECORD or end > size:
            return
        if crc32c.crc32c(buf[off + RECORD_HEADER_SIZE : end]) != crc:
            return
        yield pos, off, length
        off = end


class SegmentLog:
    """The log files of one segment. Not thread-safe: owned by the event loop; staged chunks
    are handed to the :class:`LogWriter` threads, which own the active file descriptor."""

    def __init__(
        self, directory: Path, *, roll_bytes: int = 64 * 1024 * 1024, index_interval: int = 65536
    ) -> None:
        self.directory = directory
        self.roll_bytes = roll_bytes
        self.index_interval = index_interval
        self.files: list[LogFile] = []
        self._bases: list[int] = []
        self._fd: int | None = None
        self._pending = bytearray()
        self._pending_index: list[tuple[int, int]] = []
        self._last_indexed_off = -(1 << 62)
        self.writer: LogWriter | None = None
        self.next_position = 0
        self.written_position = -1
        self.durable_position = -1
        self.first_position = 0

    # --- opening / recovery --------------------------------------------------------------------

    def open(self) -> RecoveryReport:
        """Load the file list, rebuild indexes, truncate a torn tail of the last file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        bases = sorted(
            int(m.group(1)) for p in self.directory.iterdir() if (m := _LOG_NAME.match(p.name))
        )
        truncated = 0
        truncated_file: str | None = None
        expected: int | None = None
        for i, base in enumerate(bases):
            path = self.directory / log_name(base)
            lf = LogFile(base=base, path=path)
            last = i == len(bases) - 1
            if expected is not None and base != expected:
                raise CorruptLogError(f"{path}: starts at {base}, previous file ends at {expected}")
            if not last and self._load_index(lf):
                pass
            else:
                data = path.read_bytes()
                good = self._scan_into(lf, data)
                if good != len(data):
                    if not last:
                        raise CorruptLogError(
                            f"{path}: damaged record at offset {good} in a non-final log file"
                        )
                    truncated = len(data) - good
                    truncated_file = path.name
                    log.warning(
                        "torn tail in %s: truncating %d bytes at offset %d (position %d)",
                        path,
                        truncated,
                        good,
                        lf.next_position,
                    )
                    with open(path, "r+b") as fh:
                        fh.truncate(good)
                        fh.flush()
                        os.fsync(fh.fileno())
                lf.size = good
            expected = lf.next_position
            self.files.append(lf)
            self._bases.append(base)
        if not self.files:
            self._new_file(0)
        else:
            self._open_fd(self.files[-1])
        self.next_position = self.files[-1].next_position
        self.written_position = self.durable_position = self.next_position - 1
        self.first_position = self.files[0].base
        return RecoveryReport(self.next_position, truncated, truncated_file)

    def _scan_into(self, lf: LogFile, data: bytes) -> int:
        expected = lf.base
        good = 0
        last_indexed = -(1 << 62)
        for pos, off, length in scan_records(data):
            if pos != expected:
                break
            if off - last_indexed >= self.index_interval:
                lf.add_index(pos, off)
                last_indexed = off
            expected += 1
            good = off + RECORD_HEADER_SIZE + length
        lf.next_position = expected
        return good

    def _load_index(self, lf: LogFile) -> bool:
        """Use a rolled file's persisted index; False when it is missing or implausible."""
        idx_path = self.directory / index_name(lf.base)
        try:
            raw = idx_path.read_bytes()
            size = lf.path.stat().st_size
        except FileNotFoundError:
            return False
        if len(raw) < 16 or (len(raw) - 16) % INDEX_ITEM.size:
            return False
        next_position, file_size = struct.unpack_from("<qQ", raw, 0)
        if file_size != size or next_position < lf.base:
            return False
        for pos, off in INDEX_ITEM.iter_unpack(memoryview(raw)[16:]):
            lf.add_index(pos, off)
        lf.next_position = next_position
        lf.size = size
        return True

    def _write_index(self, lf: LogFile) -> None:
        parts = [struct.pack("<qQ", lf.next_position, lf.size)]
        parts.extend(
            INDEX_ITEM.pack(p, o) for p, o in zip(lf.index_positions, lf.index_offsets, strict=True)
        )
        tmp = self.directory / (index_name(lf.base) + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(b"".join(parts))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.directory / index_name(lf.base))

    def _open_fd(self, lf: LogFile) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(lf.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _new_file(self, base: int) -> None:
        lf = LogFile(base=base, path=self.directory / log_name(base), next_position=base)
        self._open_fd(lf)
        fsync_dir(self.directory)
        self.files.append(lf)
        self._bases.append(base)

    # --- appending -----------------------------------------------------------------------------

    def stage(self, entry: bytes | memoryview) -> int:
        """Buffer one entry for the next chunk and return its position."""
        pos = self.next_position
        self.next_position = pos + 1
        off = len(self._pending)
        if off - self._last_indexed_off >= self.index_interval:
            self._pending_index.append((pos, off))
            self._last_indexed_off = off
        self._pending += RECORD_HEADER.pack(len(entry), crc32c.crc32c(entry), pos)
        self._pending += entry
        return pos

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    @property
    def pending_bytes(self) -> int:
        return len(self._pending)

    def take_pending(self) -> tuple[bytearray, list[tuple[int, int]], int]:
        """Detach the staged bytes: ``(data, index points, last position)``."""
        data = self._pending
        index = self._pending_index
        self._pending = bytearray()
        self._pending_index = []
        self._last_indexed_off = -(1 << 62)
        return data, index, self.next_position - 1

    def commit_chunk(self) -> tuple[bytearray, int, LogFile | None]:
        """Take everything staged as one chunk for the writer and account for it in the file
        list (readers are gated by ``written_position``, so this may run ahead of the disk).

        Returns ``(data, last position, rolled)``: ``rolled`` is the file that this chunk
        filled up; the caller then queues a roll (:meth:`LogWriter.submit_roll`) to the file
        that is already appended to ``files``.
        """
        data, index, last = self.take_pending()
        lf = self.files[-1]
        base_off = lf.size
        for pos, off in index:
            lf.add_index(pos, base_off + off)
        lf.size += len(data)
        lf.next_position = last + 1
        if lf.size < self.roll_bytes:
            return data, last, None
        new = LogFile(
            base=last + 1, path=self.directory / log_name(last + 1), next_position=last + 1
        )
        self.files.append(new)
        self._bases.append(new.base)
        return data, last, lf

    def start_writer(
        self, *, sync_each: bool, interval_s: float, notify: Callable[[], object]
    ) -> LogWriter:
        """Hand the active file to a new :class:`LogWriter` (after :meth:`open`)."""
        fd = self._fd
        assert fd is not None and self.writer is None
        self._fd = None
        self.writer = LogWriter(
            fd,
            self.directory,
            synced_position=self.durable_position,
            sync_each=sync_each,
            interval_s=interval_s,
            notify=notify,
            name=self.directory.name,
        )
        return self.writer

    def mark_written(self, position: int) -> None:
        if position > self.written_position:
            self.written_position = position

    def mark_durable(self, position: int) -> None:
        if position > self.durable_position:
            self.durable_position = position

    def write_index_blocking(self, lf: LogFile) -> None:
        if lf.path.exists():
            self._write_index(lf)

    # --- reading -------------------------------------------------------------------------------

    def file_for(self, position: int) -> LogFile | None:
        i = bisect.bisect_right(self._bases, position) - 1
        if i < 0:
            return None
        lf = self.files[i]
        return lf if position < lf.next_position else None

    def read(self, position: int, max_entries: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """Written entries from ``position`` on (at least one if any), from one file."""
        lf = self.file_for(position)
        if lf is None or position > self.written_position:
            return []
        start = lf.seek_hint(position)
        out: list[tuple[int, bytes]] = []
        total = 0
        limit = min(position + max_entries, self.written_position + 1)
        with open(lf.path, "rb") as fh:
            fh.seek(start)
            data = fh.read(min(max(_READ_CHUNK, max_bytes + RECORD_HEADER_SIZE * 2), _READ_MAX))
            off = 0
            while True:
                if off + RECORD_HEADER_SIZE > len(data):
                    more = fh.read(_READ_CHUNK)
                    if not more:
                        break
                    data = data[off:] + more
                    off = 0
                    continue
                length, crc, pos = RECORD_HEADER.unpack_from(data, off)
                if length > MAX_RECORD:
                    log.error("%s: corrupt record header at offset %d", lf.path, off)
                    break
                end = off + RECORD_HEADER_SIZE + length
                if end > len(data):
                    more = fh.read(max(_READ_CHUNK, end - len(data)))
                    if not more:
                        break
                    data = data[off:] + more
                    off = 0
                    continue
                if pos >= position:
                    if pos >= limit or (out and total + length > max_bytes):
                        break
                    entry = data[off + RECORD_HEADER_SIZE : end]
                    if crc32c.crc32c(entry) != crc:
                        # Never hand out damaged data: readers stop here and it is logged.
                        log.error("%s: checksum mismatch at position %d", lf.path, pos)
                        break
                    out.append((pos, entry))
                    total += length
                off = end
        return out

    # --- retention / lifecycle -----------------------------------------------------------------

    def deletable_files(self, below: int) -> list[LogFile]:
        """Rolled files whose every entry is below ``below`` (never the active file)."""
        return [lf for lf in self.files[:-1] if lf.next_position <= below]

    def drop_files(self, files: list[LogFile]) -> None:
        """Forget ``files`` (the oldest ones); the caller deletes them on disk."""
        drop = {id(f) for f in files}
        self.files = [f for f in self.files if id(f) not in drop]
        self._bases = [f.base for f in self.files]
        self.first_position = self.files[0].base

    def delete_files_blocking(self, files: list[LogFile]) -> None:
        for lf in files:
            for path in (lf.path, self.directory / index_name(lf.base)):
                path.unlink(missing_ok=True)
        fsync_dir(self.directory)

    def close(self, *, sync: bool = True) -> None:
        """Stop the writer (after it wrote and, with ``sync``, synced what it was given)."""
        if self.writer is not None:
            self.writer.stop(final_sync=sync)
            self.writer = None
        if self._fd is not None:
            if sync:
                fdatasync(self._fd)
            os.close(self._fd)
            self._fd = None

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


class LogWriter:
    """Pipelined group commit for one segment log: a writer thread and a syncer thread.

    The event loop queues chunks (:meth:`submit_write`) and rolls (:meth:`submit_roll`); the
    writer appends chunks in order as soon as it is free and publishes ``written_position``;
    the syncer, whenever something was written since its last sync, notes the written position
    and file, runs ``fdatasync`` and then publishes that position as ``synced_position``. So a
    sync always covers exactly what was written before it started, and writing the next chunks
    overlaps with it. With ``sync_each=False`` (``fsync=interval``) the syncer instead runs every
    ``interval_s`` seconds.

    ``notify`` is called from the threads (coalesced: at most one call until :meth:`take`) when
    ``written_position`` (interval mode), ``synced_position``, a roll or an error is new.
    """

    def __init__(
        self,
        fd: int,
        directory: Path,
        *,
        synced_position: int,
        sync_each: bool,
        interval_s: float,
        notify: Callable[[], object],
        name: str = "",
    ) -> None:
        self.directory = directory
        self.sync_each = sync_each
        self.interval_s = interval_s
        self._notify_cb = notify
        self._lock = threading.Lock()
        self._writer_cv = threading.Condition(self._lock)
        self._syncer_cv = threading.Condition(self._lock)
        self._ops: list[tuple[bytearray | bytes, int] | Path] = []
        self._fd = fd
        self._retired: list[int] = []
        self._stopping = False
        self._writer_done = False
        self._final_sync = True
        self._notified = False
        self.written_position = synced_position
        self.synced_position = synced_position
        self._sync_durations: list[float] = []
        self._rolls_done = 0
        self.error: BaseException | None = None
        self._writer = threading.Thread(target=self._write_loop, name=f"log-write {name}")
        self._syncer = threading.Thread(target=self._sync_loop, name=f"log-sync {name}")
        self._writer.daemon = self._syncer.daemon = True
        self._writer.start()
        self._syncer.start()

    # --- event-loop side -----------------------------------------------------------------------

    def submit_write(self, data: bytearray | bytes, last_position: int) -> None:
        """Queue a chunk for the writer thread. Not written on the event loop: a buffered
        append can block on the filesystem journal while other processes sync."""
        with self._lock:
            self._ops.append((data, last_position))
            self._writer_cv.notify()

    def submit_roll(self, path: Path) -> None:
        """Continue in a new file at ``path`` after the chunks submitted so far."""
        with self._lock:
            self._ops.append(path)
            self._writer_cv.notify()

    def take(self) -> tuple[int, int, list[float], int, BaseException | None]:
        """``(written, synced, sync durations, rolls completed, error)`` since the last call;
        re-arms ``notify``."""
        with self._lock:
            self._notified = False
            durations = self._sync_durations
            self._sync_durations = []
            rolls = self._rolls_done
            self._rolls_done = 0
            return self.written_position, self.synced_position, durations, rolls, self.error

    def stop(self, *, final_sync: bool = True) -> None:
        """Blocking: write what was submitted, sync it (unless ``final_sync`` is false or a
        write failed), stop both threads and close the files."""
        with self._lock:
            self._stopping = True
            self._final_sync = final_sync
            self._writer_cv.notify()
            self._syncer_cv.notify()
        self._writer.join()
        self._syncer.join()
        for fd in (*self._retired, self._fd):
            os.close(fd)
        self._retired = []

    # --- threads -------------------------------------------------------------------------------

    def _notify(self) -> None:
        """Call with the lock held."""
        if not self._notified:
            self._notified = True
            # RuntimeError: the event loop is closed, nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                self._notify_cb()

    def _fail(self, exc: BaseException) -> None:
        log.error("log %s: I/O failed: %s", self.directory, exc)
        with self._lock:
            if self.error is None:
                self.error = exc
            self._stopping = True
            self._syncer_cv.notify()
            self._writer_cv.notify()
            self._notify()

    def _write_loop(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._ops and not self._stopping:
                        self._writer_cv.wait()
                    if self.error is not None or (not self._ops and self._stopping):
                        break
                    ops = self._ops
                    self._ops = []
                self._write_ops(ops)
        except BaseException as exc:
            self._fail(exc)
        finally:
            with self._lock:
                self._writer_done = True
                self._syncer_cv.notify()

    def _write_ops(self, ops: list[tuple[bytearray | bytes, int] | Path]) -> None:
        bufs: list[bytearray | bytes] = []
        size = 0
        last = -1
        for op in ops:
            if isinstance(op, Path):
                if bufs:
                    self._writev(bufs, last)
                    bufs, size = [], 0
                self._roll(op)
                continue
            data, last = op
            bufs.append(data)
            size += len(data)
            if size >= _WRITE_SLICE or len(bufs) >= _IOV_MAX:
                self._writev(bufs, last)
                bufs, size = [], 0
        if bufs:
            self._writev(bufs, last)

    def _writev(self, bufs: list[bytearray | bytes], last_position: int) -> None:
        fd = self._fd
        views = [memoryview(b) for b in bufs]
        while views:
            n = os.writev(fd, views)
            while views and n >= len(views[0]):
                n -= len(views[0])
                views.pop(0)
            if n:
                views[0] = views[0][n:]
        with self._lock:
            self.written_position = last_position
            self._syncer_cv.notify()
            if not self.sync_each:
                self._notify()

    def _roll(self, path: Path) -> None:
        """Sync the old file completely, create the new one and make its name durable; only
        then does the new file receive data (whose sync alone would not persist the name)."""
        old = self._fd
        with self._lock:
            written = self.written_position
            need_sync = written > self.synced_position
        if need_sync:
            t0 = time.perf_counter()
            fdatasync(old)
            elapsed = time.perf_counter() - t0
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        fsync_dir(self.directory)
        with self._lock:
            if need_sync:
                self._sync_durations.append(elapsed)
                if written > self.synced_position:
                    self.synced_position = written
            self._retired.append(old)
            self._fd = fd
            self._rolls_done += 1
            self._notify()

    def _sync_loop(self) -> None:
        try:
            while True:
                with self._lock:
                    if self.sync_each:
                        while not self._stopping and self.written_position <= self.synced_position:
                            self._syncer_cv.wait()
                    else:
                        # Writes notify this condition too: sleep out the whole interval.
                        due = time.monotonic() + self.interval_s
                        while not self._stopping and (left := due - time.monotonic()) > 0:
                            self._syncer_cv.wait(left)
                    if self._stopping:
                        while not self._writer_done:
                            self._syncer_cv.wait()
                        if (
                            self.error is not None
                            or not self._final_sync
                            or self.written_position <= self.synced_position
                        ):
                            return
                    elif self.written_position <= self.synced_position:
                        continue
                    for retired in self._retired:
                        os.close(retired)
                    self._retired = []
                    target = self.written_position
                    fd = self._fd
                t0 = time.perf_counter()
                fdatasync(fd)
                elapsed = time.perf_counter() - t0
                with self._lock:
                    self._sync_durations.append(elapsed)
                    if target > self.synced_position:
                        self.synced_position = target
                    self._notify()
        except BaseException as exc:
            self._fail(exc)

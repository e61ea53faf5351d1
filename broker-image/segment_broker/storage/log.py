"""Append-only segment log: framed, checksummed files with a sparse index and group commit.

On disk a segment's log is a sequence of files ``log-<base>.log`` where ``<base>`` (20 digits) is
the position of the file's first entry. Each record is::

    u32 length | u32 crc32c(entry) | i64 position | entry bytes (length bytes)

A *position* is the index of the entry in the segment: 0, 1, 2, … with no gaps, across files.
Files roll once they reach ``roll_bytes``. A sparse index ``log-<base>.idx`` (pairs of i64
position, u64 file offset, one every ``index_interval`` bytes) is written when a file is rolled
and rebuilt by scanning otherwise.

Durability: :meth:`SegmentLog.stage` only buffers; :meth:`SegmentLog.flush` writes everything
staged since the last flush with one ``write`` and one ``fdatasync`` in a worker thread (group
commit). ``durable_position`` is the last position covered by a completed flush.

Recovery scans the last file record by record and truncates it at the first record that is
short, fails its checksum or has an unexpected position (a torn tail after a crash). Nothing that
was acknowledged can be lost that way: an acknowledgement is only sent after its flush returned.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import struct
from collections.abc import Iterator
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
    """The log files of one segment. Not thread-safe: owned by the event loop; only the bytes
    of one flush are handed to a worker thread at a time."""

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
        """Buffer one entry for the next flush and return its position."""
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
        """Detach the staged bytes for one flush: ``(data, index points, last position)``."""
        data = self._pending
        index = self._pending_index
        self._pending = bytearray()
        self._pending_index = []
        self._last_indexed_off = -(1 << 62)
        return data, index, self.next_position - 1

    def write_blocking(self, data: bytearray | bytes, sync: bool) -> None:
        """Worker-thread part of a flush: write all of ``data`` and optionally fdatasync."""
        fd = self._fd
        assert fd is not None
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if sync:
            os.fdatasync(fd)

    def sync_blocking(self) -> None:
        if self._fd is not None:
            os.fdatasync(self._fd)

    def complete_write(self, size: int, index: list[tuple[int, int]], last_position: int) -> None:
        """Event-loop part of a flush after ``write_blocking`` returned."""
        lf = self.files[-1]
        base_off = lf.size
        for pos, off in index:
            lf.add_index(pos, base_off + off)
        lf.size += size
        lf.next_position = last_position + 1
        self.written_position = last_position

    def mark_durable(self, position: int) -> None:
        if position > self.durable_position:
            self.durable_position = position

    def needs_roll(self) -> bool:
        return self.files[-1].size >= self.roll_bytes and not self._pending

    def roll_blocking(self, sync_old: bool) -> tuple[LogFile, int]:
        """Worker-thread part of a roll: create the next file and make its name durable.

        Call only between flushes (nothing in flight); :meth:`roll_commit` then switches over
        on the event loop, so readers never see a half-updated file list. ``sync_old`` is needed
        only when flushes do not fdatasync themselves (``fsync=interval``). The old file's index
        is written afterwards by :meth:`write_index_blocking` (it can always be rebuilt).
        """
        lf = self.files[-1]
        if sync_old and self._fd is not None:
            os.fdatasync(self._fd)
        base = lf.next_position
        new = LogFile(base=base, path=self.directory / log_name(base), next_position=base)
        fd = os.open(new.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        fsync_dir(self.directory)
        return new, fd

    def write_index_blocking(self, lf: LogFile) -> None:
        if lf.path.exists():
            self._write_index(lf)

    def roll_commit(self, new: LogFile, fd: int) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        self.files.append(new)
        self._bases.append(new.base)

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

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

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

Recovery verifies every file. A rolled file whose index carries the checksum of the whole file
(written when it was rolled) is verified by that one checksum; otherwise, and always for the last
file, every record is checked: its checksum, a sane header and the next position. A *torn tail*
is a damaged record in the last file with no intact record anywhere after it (bytes of a write
that a crash cut short), after an unclean shutdown: it is truncated, logged with its byte count
and counted. A clean close leaves a marker (``clean-shutdown.json``: the last file and its size)
that recovery consumes; after a clean shutdown no tail can be torn, so any damage is corruption.
Anything else is *corruption*: a damaged record with an intact record after it, any damage in a
rolled file, a file that does not start where the previous one ends, or a last file shorter than
at the clean shutdown. Corruption is never truncated: the
log keeps its bytes as they are, serves the positions before the first damaged record, and
reports a :class:`Corruption` (the segment refuses appends until an operator truncates it
explicitly with :meth:`SegmentLog.truncate_blocking`, acknowledging the loss). A damaged record
found later by a read is reported the same way. Nothing that was acknowledged can be cut off as
a torn tail: an acknowledgement is only sent after its sync returned, and a synced record is
followed by nothing or by intact records.
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
from typing import Any

import crc32c

from .fsutil import atomic_write_json, fsync_dir, read_json
from .pagecache import drop_later

log = logging.getLogger(__name__)

RECORD_HEADER = struct.Struct("<IIq")
RECORD_HEADER_SIZE = RECORD_HEADER.size
INDEX_ITEM = struct.Struct("<qQ")
INDEX_HEADER = struct.Struct("<8sqQII")
"""``magic, next position, file size, crc32c of the whole file, reserved``: a rolled file's
index carries its checksum, so recovery verifies the file with one pass of crc32c."""
INDEX_MAGIC = b"STIDX\x02\x00\x00"
CLEAN_SHUTDOWN = "clean-shutdown.json"
MAX_RECORD = 64 * 1024 * 1024
_LOG_NAME = re.compile(r"^log-(\d{20})\.log$")
_READ_CHUNK = 64 * 1024
_READ_MAX = 8 * 1024 * 1024
_WRITE_SLICE = 2 * 1024 * 1024
"""Bytes per ``writev``: the writer publishes progress at least this often, so the syncer can
start on the first part of a large backlog while the rest is still being written."""
_IOV_MAX = 1024
_DROP_STEP_MIN = 1024 * 1024
_VERIFY_CHUNK = 8 * 1024 * 1024
_NONZERO = re.compile(b"[^\x00]")

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
    crc: int = 0
    """crc32c of the file's first ``size`` bytes (kept up to date as chunks are added)."""

    @property
    def last_position(self) -> int:
        return self.next_position - 1

    def add_index(self, position: int, offset: int) -> None:
        self.index_positions.append(position)
        self.index_offsets.append(offset)

    def seek_hint(self, position: int) -> tuple[int, int]:
        """``(position, file offset)`` of the last indexed record at or before ``position``."""
        i = bisect.bisect_right(self.index_positions, position) - 1
        if i < 0:
            return self.base, 0
        return self.index_positions[i], self.index_offsets[i]


@dataclass(frozen=True)
class Corruption:
    """Where a segment's log is damaged: ``position`` is the first position that cannot be
    served (the damaged record's), at byte ``offset`` of ``file``. ``source`` says who found it:
    ``recovery`` or ``read``."""

    position: int
    file: str
    offset: int
    reason: str
    source: str
    detected_at: float

    def to_json(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "file": self.file,
            "offset": self.offset,
            "reason": self.reason,
            "source": self.source,
            "detectedAt": self.detected_at,
        }


@dataclass(frozen=True)
class RecoveryReport:
    next_position: int
    truncated_bytes: int
    truncated_file: str | None
    corruption: Corruption | None = None
    verified_bytes: int = 0


@dataclass(frozen=True)
class TruncateReport:
    """What an explicit truncation removed."""

    position: int
    dropped_bytes: int
    dropped_files: list[str]


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


def describe_damage(data: bytes | memoryview, off: int, expected: int) -> str:
    """Why the record at ``off`` (which should hold position ``expected``) is not intact."""
    size = len(data)
    if off + RECORD_HEADER_SIZE > size:
        return f"the file ends inside a record header ({size - off} of {RECORD_HEADER_SIZE} bytes)"
    length, crc, pos = RECORD_HEADER.unpack_from(data, off)
    if length > MAX_RECORD:
        return f"record header with an impossible length {length}"
    if off + RECORD_HEADER_SIZE + length > size:
        return f"the file ends inside a record of {length} bytes"
    body = memoryview(data)[off + RECORD_HEADER_SIZE : off + RECORD_HEADER_SIZE + length]
    if crc32c.crc32c(body) != crc:
        return "checksum mismatch"
    return f"record holds position {pos}, expected {expected}"


def _intact_at(data: bytes | memoryview, off: int, low: int, high: int) -> bool:
    length, crc, pos = RECORD_HEADER.unpack_from(data, off)
    end = off + RECORD_HEADER_SIZE + length
    if not (0 < length <= MAX_RECORD and end <= len(data) and low <= pos <= high):
        return False
    actual: int = crc32c.crc32c(memoryview(data)[off + RECORD_HEADER_SIZE : end])
    return bool(actual == crc)


def find_intact_record(data: bytes, start: int, expected: int) -> int | None:
    """Offset of the first intact record that starts after ``start`` (the damaged record, which
    should hold position ``expected``), or None: is the damage a torn tail or corruption?

    Intact means: a non-empty entry that ends inside the file, whose checksum matches, and whose
    position could follow ``expected`` (between ``expected`` and one per record header that
    fits in the rest of the file). Every byte offset is a candidate (a damaged length hides where
    the next record starts); candidates are found in C (``bytes.find`` of the position's high
    bytes, runs of zero bytes skipped as a whole) so a tail of megabytes costs milliseconds.
    """
    size = len(data)
    high = expected + max(0, size - start) // (RECORD_HEADER_SIZE + 1) + 1
    found: int | None = None
    # Bytes 3..7 of the little-endian position (bytes 11..15 of the header) are the same for
    # every position within one 2**24 block; at most a few blocks can hold a plausible one.
    for block in range(expected >> 24, (high >> 24) + 1):
        pattern = struct.pack("<q", block << 24)[3:]
        stop = size if found is None else found
        at = start + 1 + 11
        while True:
            hit = data.find(pattern, at, stop + 16)
            if hit < 0:
                break
            off = hit - 11
            if off + RECORD_HEADER_SIZE > size or off >= stop:
                break
            if _intact_at(data, off, expected, high):
                found = off
                break
            if data[off : off + 4] == b"\x00\x00\x00\x00":
                # An empty length is never a record: jump to the next non-zero byte (the next
                # candidate's length field must hold one).
                nz = _NONZERO.search(data, off + 4)
                if nz is None:
                    break
                at = max(hit + 1, nz.start() - 3 + 11)
            else:
                at = hit + 1
    return found


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
        self.corruption: Corruption | None = None
        """Set at recovery or by a read that met a damaged record: positions from
        ``corruption.position`` on are not served and nothing may be appended."""

    # --- opening / recovery --------------------------------------------------------------------

    def open(self) -> RecoveryReport:
        """Load and verify the files, rebuild missing indexes, truncate a torn tail of the last
        file; stop at corruption, leaving every byte as it is (see the module docstring)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        clean = self._take_clean_marker()
        bases = sorted(
            int(m.group(1)) for p in self.directory.iterdir() if (m := _LOG_NAME.match(p.name))
        )
        truncated = 0
        truncated_file: str | None = None
        corruption: Corruption | None = None
        verified = 0
        expected: int | None = None
        now = time.time()
        for i, base in enumerate(bases):
            path = self.directory / log_name(base)
            last = i == len(bases) - 1
            if expected is not None and base != expected:
                corruption = Corruption(
                    expected,
                    path.name,
                    0,
                    f"the file starts at position {base}, the previous one ends before {expected}",
                    "recovery",
                    now,
                )
                break
            lf = LogFile(base=base, path=path)
            if not last and self._verified_by_index(lf):
                verified += lf.size
                expected = lf.next_position
                self.files.append(lf)
                self._bases.append(base)
                continue
            data = path.read_bytes()
            verified += len(data)
            good = self._scan_into(lf, data)
            lf.size = good
            lf.crc = crc32c.crc32c(memoryview(data)[:good])
            reason: str | None = None
            if good != len(data):
                if not last:
                    reason = describe_damage(data, good, lf.next_position) + " in a rolled file"
                elif clean is not None:
                    reason = describe_damage(data, good, lf.next_position) + (
                        " after a clean shutdown"
                    )
                elif find_intact_record(data, good, lf.next_position) is not None:
                    reason = describe_damage(data, good, lf.next_position) + (
                        "; intact records follow it"
                    )
            elif (
                last
                and clean is not None
                and clean.get("file") == path.name
                and len(data) < int(clean.get("size", 0))
            ):
                reason = f"the file is {len(data)} bytes, {clean['size']} at the clean shutdown"
            if reason is not None:
                corruption = Corruption(lf.next_position, path.name, good, reason, "recovery", now)
                self.files.append(lf)
                self._bases.append(base)
                break
            if good != len(data):
                truncated = len(data) - good
                truncated_file = path.name
                log.warning(
                    "torn tail in %s: truncating %d bytes at offset %d (position %d); nothing "
                    "intact follows",
                    path,
                    truncated,
                    good,
                    lf.next_position,
                )
                with open(path, "r+b") as fh:
                    fh.truncate(good)
                    fh.flush()
                    os.fsync(fh.fileno())
            elif not last:
                # Its index was missing, from an older version or did not match the file.
                self._write_index(lf)
            expected = lf.next_position
            self.files.append(lf)
            self._bases.append(base)
        if corruption is None and clean is not None and bases:
            missing = _LOG_NAME.match(str(clean.get("file", "")))
            if missing is not None and int(missing.group(1)) > bases[-1]:
                corruption = Corruption(
                    self.files[-1].next_position,
                    str(clean["file"]),
                    0,
                    "the file was there at the clean shutdown and is missing",
                    "recovery",
                    now,
                )
        if not self.files:
            self._new_file(0)
        else:
            self._open_fd(self.files[-1])
        self.corruption = corruption
        self.next_position = self.files[-1].next_position
        self.written_position = self.durable_position = self.next_position - 1
        self.first_position = self.files[0].base
        return RecoveryReport(self.next_position, truncated, truncated_file, corruption, verified)

    def _take_clean_marker(self) -> dict[str, Any] | None:
        """Read and remove the clean-shutdown marker (durably: a crash from now on must find
        none, so a torn tail is recognised as such)."""
        path = self.directory / CLEAN_SHUTDOWN
        try:
            body = read_json(path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("%s: unreadable clean-shutdown marker (%s); taken as unclean", path, exc)
            body = None
        path.unlink(missing_ok=True)
        fsync_dir(self.directory)
        return body if isinstance(body, dict) else None

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

    def _verified_by_index(self, lf: LogFile) -> bool:
        """A rolled file whose index names its size and checksum, and whose bytes match both:
        verified with one crc32c pass, no record parsing. False otherwise (nothing loaded)."""
        idx_path = self.directory / index_name(lf.base)
        try:
            raw = idx_path.read_bytes()
        except FileNotFoundError:
            return False
        if len(raw) < INDEX_HEADER.size or (len(raw) - INDEX_HEADER.size) % INDEX_ITEM.size:
            return False
        magic, next_position, size, crc, _ = INDEX_HEADER.unpack_from(raw, 0)
        if magic != INDEX_MAGIC or next_position < lf.base:
            return False
        actual = 0
        actual_size = 0
        with open(lf.path, "rb", buffering=0) as fh:
            while chunk := fh.read(_VERIFY_CHUNK):
                actual = crc32c.crc32c(chunk, actual)
                actual_size += len(chunk)
        if actual_size != size or actual != crc:
            return False
        for pos, off in INDEX_ITEM.iter_unpack(memoryview(raw)[INDEX_HEADER.size :]):
            lf.add_index(pos, off)
        lf.next_position = next_position
        lf.size = size
        lf.crc = crc
        return True

    def _write_index(self, lf: LogFile) -> None:
        parts = [INDEX_HEADER.pack(INDEX_MAGIC, lf.next_position, lf.size, lf.crc, 0)]
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
        lf.crc = crc32c.crc32c(data, lf.crc)
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
        self,
        *,
        sync_each: bool,
        interval_s: float,
        notify: Callable[[], object],
        page_cache_bytes: int = 0,
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
            page_cache_bytes=page_cache_bytes,
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
        """Written entries from ``position`` on (at least one if any), from one file.

        Damaged data is never handed out: a record that fails its checksum, has an impossible
        header or an unexpected position, or a file that ends before a written position, stops
        the read there and sets :attr:`corruption` (the entries before it are returned).
        """
        lf = self.file_for(position)
        if lf is None or position > self.written_position:
            return []
        expect, start = lf.seek_hint(position)
        out: list[tuple[int, bytes]] = []
        total = 0
        limit = min(position + max_entries, self.written_position + 1)
        needed = min(limit, lf.next_position)
        with open(lf.path, "rb") as fh:
            fh.seek(start)
            data = fh.read(min(max(_READ_CHUNK, max_bytes + RECORD_HEADER_SIZE * 2), _READ_MAX))
            base = start
            off = 0
            while expect < needed:
                if off + RECORD_HEADER_SIZE > len(data):
                    more = fh.read(_READ_CHUNK)
                    if not more:
                        self._damaged(lf, expect, base + off, "the file ends before this position")
                        break
                    data = data[off:] + more
                    base += off
                    off = 0
                    continue
                length, crc, pos = RECORD_HEADER.unpack_from(data, off)
                if length > MAX_RECORD:
                    self._damaged(
                        lf, expect, base + off, f"record header with an impossible length {length}"
                    )
                    break
                end = off + RECORD_HEADER_SIZE + length
                if end > len(data):
                    more = fh.read(max(_READ_CHUNK, end - len(data)))
                    if not more:
                        reason = f"the file ends inside a record of {length} bytes"
                        self._damaged(lf, expect, base + off, reason)
                        break
                    data = data[off:] + more
                    base += off
                    off = 0
                    continue
                if pos != expect:
                    self._damaged(
                        lf, expect, base + off, f"record holds position {pos}, expected {expect}"
                    )
                    break
                if pos >= position:
                    if out and total + length > max_bytes:
                        break
                    entry = data[off + RECORD_HEADER_SIZE : end]
                    if crc32c.crc32c(entry) != crc:
                        self._damaged(lf, expect, base + off, "checksum mismatch")
                        break
                    out.append((pos, entry))
                    total += length
                expect += 1
                off = end
        return out

    def _damaged(self, lf: LogFile, position: int, offset: int, reason: str) -> None:
        """A read met damage: remember the lowest damaged position (the owner quarantines)."""
        log.error(
            "%s: damaged record at offset %d (position %d): %s",
            lf.path,
            offset,
            position,
            reason,
            extra={"event": "log_damaged", "position": position, "offset": offset},
        )
        if self.corruption is None or position < self.corruption.position:
            self.corruption = Corruption(
                position, lf.path.name, offset, reason, "read", time.time()
            )

    def truncate_blocking(self, position: int) -> TruncateReport:
        """Cut a corrupted log at ``position``, the first damaged one: the file holding it is
        truncated at that record (or removed when the damage is that it starts at the wrong
        position), every later log file and index is removed. Only for an operator who
        acknowledged the loss; call it on a closed log, then open the segment again."""
        corruption = self.corruption
        if corruption is None or corruption.position != position:
            raise ValueError(f"{self.directory}: not corrupted at position {position}")
        names = sorted(p.name for p in self.directory.iterdir() if _LOG_NAME.match(p.name))
        dropped: list[str] = []
        dropped_bytes = 0
        cut = False
        for name in names:
            path = self.directory / name
            base = int(name[4:24])
            if name == corruption.file and (corruption.offset > 0 or base == position):
                size = path.stat().st_size
                dropped_bytes += size - corruption.offset
                with open(path, "r+b") as fh:
                    fh.truncate(corruption.offset)
                    fh.flush()
                    os.fsync(fh.fileno())
                (self.directory / index_name(base)).unlink(missing_ok=True)
                cut = True
            elif cut or name >= corruption.file:
                dropped_bytes += path.stat().st_size
                dropped.append(name)
                path.unlink()
                (self.directory / index_name(base)).unlink(missing_ok=True)
                cut = True
        (self.directory / CLEAN_SHUTDOWN).unlink(missing_ok=True)
        fsync_dir(self.directory)
        return TruncateReport(position, dropped_bytes, dropped)

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
        """Stop the writer (after it wrote and, with ``sync``, synced what it was given). With
        ``sync`` (and no write error) the clean-shutdown marker names the last file and its
        size: the next recovery then takes any damage for corruption, never for a torn tail."""
        failed = False
        if self.writer is not None:
            self.writer.stop(final_sync=sync)
            failed = self.writer.error is not None
            self.writer = None
        if self._fd is not None:
            if sync:
                fdatasync(self._fd)
            os.close(self._fd)
            self._fd = None
        if sync and not failed:
            names = sorted(p.name for p in self.directory.iterdir() if _LOG_NAME.match(p.name))
            if names:
                size = (self.directory / names[-1]).stat().st_size
                atomic_write_json(
                    self.directory / CLEAN_SHUTDOWN, {"file": names[-1], "size": size}
                )

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class WriterProgress:
    """What a :class:`LogWriter` reports to the event loop (:meth:`LogWriter.take`)."""

    written: int
    synced: int
    sync_durations: list[float]
    written_at: list[tuple[int, float]]
    """``(last position written, time.perf_counter())`` per write, in order."""
    synced_at: list[tuple[int, float]]
    """``(last position covered, time.perf_counter())`` per completed sync, in order."""
    rolls: int
    error: BaseException | None


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

    ``page_cache_bytes`` (> 0): after each sync the syncer has what it synced dropped from the
    page cache (``posix_fadvise(DONTNEED)`` on the process's drop thread, :mod:`.pagecache`)
    except the file's last ``page_cache_bytes``, and a rolled file entirely. A busy log then
    writes into the memory it freed a moment earlier instead of growing the page cache over the
    whole machine's memory, where every new page costs the kernel a reclaim (or, on a VM that
    returns free memory to its host, a fault in the host). Readers behind that window read from
    the disk.
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
        page_cache_bytes: int = 0,
    ) -> None:
        self.directory = directory
        self.sync_each = sync_each
        self.page_cache_bytes = page_cache_bytes
        self.interval_s = interval_s
        self._notify_cb = notify
        self._lock = threading.Lock()
        self._writer_cv = threading.Condition(self._lock)
        self._syncer_cv = threading.Condition(self._lock)
        self._ops: list[tuple[bytearray | bytes, int] | Path] = []
        self._fd = fd
        self._retired: list[int] = []
        self._written_offset = os.fstat(fd).st_size
        """Bytes in the active file (``written_position`` is its last entry)."""
        self._dropped_to = 0
        """Offset of the active file below which the syncer dropped the page cache."""
        self._stopping = False
        self._writer_done = False
        self._final_sync = True
        self._notified = False
        self.written_position = synced_position
        self.synced_position = synced_position
        self._sync_durations: list[float] = []
        self._written_at: list[tuple[int, float]] = []
        self._synced_at: list[tuple[int, float]] = []
        self._rolls_done = 0
        self.error: BaseException | None = None
        self._name = name
        self._threads: tuple[threading.Thread, threading.Thread] | None = None

    def _start_threads(self) -> None:
        """The threads start with the first write or roll: a segment never written to holds
        none (10,000 idle topics' 20,000 segments took 40,000 threads, and the machine's
        process limit)."""
        if self._threads is not None:
            return
        writer = threading.Thread(target=self._write_loop, name=f"log-write {self._name}")
        syncer = threading.Thread(target=self._sync_loop, name=f"log-sync {self._name}")
        writer.daemon = syncer.daemon = True
        writer.start()
        syncer.start()
        self._threads = (writer, syncer)

    # --- event-loop side -----------------------------------------------------------------------

    def submit_write(self, data: bytearray | bytes, last_position: int) -> None:
        """Queue a chunk for the writer thread. Not written on the event loop: a buffered
        append can block on the filesystem journal while other processes sync."""
        self._start_threads()
        with self._lock:
            self._ops.append((data, last_position))
            self._writer_cv.notify()

    def submit_roll(self, path: Path) -> None:
        """Continue in a new file at ``path`` after the chunks submitted so far."""
        self._start_threads()
        with self._lock:
            self._ops.append(path)
            self._writer_cv.notify()

    def take(self) -> WriterProgress:
        """What happened since the last call; re-arms ``notify``."""
        with self._lock:
            self._notified = False
            progress = WriterProgress(
                self.written_position,
                self.synced_position,
                self._sync_durations,
                self._written_at,
                self._synced_at,
                self._rolls_done,
                self.error,
            )
            self._sync_durations = []
            self._written_at = []
            self._synced_at = []
            self._rolls_done = 0
            return progress

    def stop(self, *, final_sync: bool = True) -> None:
        """Blocking: write what was submitted, sync it (unless ``final_sync`` is false or a
        write failed), stop both threads and close the files."""
        with self._lock:
            self._stopping = True
            self._final_sync = final_sync
            self._writer_cv.notify()
            self._syncer_cv.notify()
        for thread in self._threads or ():
            thread.join()
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
        written = 0
        while views:
            n = os.writev(fd, views)
            written += n
            while views and n >= len(views[0]):
                n -= len(views[0])
                views.pop(0)
            if n:
                views[0] = views[0][n:]
        done = time.perf_counter()
        with self._lock:
            self.written_position = last_position
            self._written_offset += written
            self._written_at.append((last_position, done))
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
            done = time.perf_counter()
            elapsed = done - t0
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        fsync_dir(self.directory)
        with self._lock:
            if need_sync:
                self._sync_durations.append(elapsed)
                self._synced_at.append((written, done))
                if written > self.synced_position:
                    self.synced_position = written
            self._retired.append(old)
            self._fd = fd
            self._written_offset = 0
            self._dropped_to = 0
            self._rolls_done += 1
            self._notify()

    def _drop_synced(self, fd: int, dropped_to: int, synced_offset: int) -> None:
        """Have the active file's synced bytes before its last ``page_cache_bytes`` dropped from
        the page cache, in steps of at least a quarter of that window (one call per step)."""
        keep = self.page_cache_bytes
        if keep <= 0:
            return
        upto = synced_offset - keep
        if upto - dropped_to < max(keep // 4, _DROP_STEP_MIN):
            return
        drop_later(os.dup(fd), dropped_to, upto - dropped_to)
        with self._lock:
            if fd == self._fd and upto > self._dropped_to:
                self._dropped_to = upto

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
                    retired, self._retired = self._retired, []
                    target = self.written_position
                    fd = self._fd
                    offset = self._written_offset
                try:
                    t0 = time.perf_counter()
                    fdatasync(fd)
                    done = time.perf_counter()
                    elapsed = done - t0
                    with self._lock:
                        self._sync_durations.append(elapsed)
                        self._synced_at.append((target, done))
                        if target > self.synced_position:
                            self.synced_position = target
                        self._notify()
                        drop_from = self._dropped_to if fd == self._fd else None
                    if drop_from is not None:
                        self._drop_synced(fd, drop_from, offset)
                finally:
                    for old in retired:
                        if self.page_cache_bytes > 0:
                            drop_later(old)
                        else:
                            os.close(old)
        except BaseException as exc:
            self._fail(exc)

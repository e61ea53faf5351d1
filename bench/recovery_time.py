"""How long a broker takes to recover (open) one large segment.

Not part of ``make bench``: a developer's measurement of the cost of verifying the log at
start-up. It writes a segment of ``--mib`` MiB (entries of ``--entry-bytes``, files rolled at
``--roll-mib``) through the real :class:`~segment_broker.storage.segment.Segment`, closes it,
and then opens it ``--runs`` times, each time with a warm page cache and again after evicting the
segment's files from the page cache (``posix_fadvise(DONTNEED)`` on those files only, so other
processes on the machine are not affected), and prints the times. ``--drop-indexes`` deletes the
rolled files' indexes first, so every record of every file is parsed and checked.

    python -m bench.recovery_time --mib 1024 --entry-bytes 1024
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from scalable_topics.core import wire
from segment_broker.storage.segment import Segment, SegmentMeta, StorageSettings


def _meta() -> SegmentMeta:
    return SegmentMeta("bench", "recovery", 0, 0, 0xFFFF, 1, 0.0)


def _evict(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


async def _fill(directory: Path, settings: StorageSettings, total: int, entry_bytes: int) -> int:
    executor = ThreadPoolExecutor(4)
    Segment.create_blocking(directory, _meta(), {"s": "Exclusive"})
    seg = Segment(directory, _meta(), settings, executor)
    await seg.open()
    value = os.urandom(max(1, entry_bytes - 40))
    written = 0
    seq = 0
    while written < total:
        entry = wire.encode_entry("p", seq, [wire.Message(value)])
        seg.append(entry, wire.decode_entry_header(entry))
        written += len(entry)
        seq += 1
        if seq % 2000 == 0:
            await seg.wait_flushed()
    await seg.wait_flushed()
    await seg.close()
    executor.shutdown()
    return seq


def _drop_indexes(directory: Path) -> None:
    for idx in directory.glob("log-*.idx"):
        idx.unlink()


async def _open_once(directory: Path, settings: StorageSettings, drop_indexes: bool) -> float:
    if drop_indexes:
        _drop_indexes(directory)
    executor = ThreadPoolExecutor(4)
    seg = Segment(directory, _meta(), settings, executor)
    t0 = time.perf_counter()
    await seg.open()
    elapsed = time.perf_counter() - t0
    await seg.close()
    executor.shutdown()
    return elapsed


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--entry-bytes", type=int, default=1024)
    ap.add_argument("--roll-mib", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="parent directory (default: a temp dir)")
    ap.add_argument(
        "--drop-indexes",
        action="store_true",
        help="delete the rolled files' indexes before each open (every record is then checked)",
    )
    args = ap.parse_args()
    settings = StorageSettings(fsync="interval", roll_bytes=args.roll_mib * 1024 * 1024)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp) / "seg"
        t0 = time.perf_counter()
        entries = await _fill(directory, settings, args.mib * 1024 * 1024, args.entry_bytes)
        size = sum(p.stat().st_size for p in directory.glob("log-*.log"))
        files = len(list(directory.glob("log-*.log")))
        print(
            f"wrote {entries} entries, {size / 2**20:.0f} MiB in {files} files "
            f"({time.perf_counter() - t0:.1f} s)"
        )
        warm: list[float] = []
        cold: list[float] = []
        for _ in range(args.runs):
            warm.append(await _open_once(directory, settings, args.drop_indexes))
            _evict(directory)
            cold.append(await _open_once(directory, settings, args.drop_indexes))
        for name, times in (("warm page cache", warm), ("evicted page cache", cold)):
            print(
                f"open ({name}): median {statistics.median(times):.3f} s, "
                f"min {min(times):.3f} s, max {max(times):.3f} s over {len(times)} runs"
            )


if __name__ == "__main__":
    asyncio.run(main())

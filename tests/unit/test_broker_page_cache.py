"""A log leaves only the last ``page_cache_bytes`` of what it synced in the OS page cache.

What is resident is read from the kernel (``mincore`` on a mapping of the file), so these
tests see the pages themselves, not the writer's bookkeeping.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from segment_broker.storage.segment import Segment

from .test_broker_storage_pipeline import _append, _open, _until

MIB = 1024 * 1024
PAGE = os.sysconf("SC_PAGE_SIZE")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def resident(path: Path, start: int = 0, end: int | None = None) -> int:
    """Bytes of ``path`` within ``[start, end)`` that are in the page cache (whole pages)."""
    size = path.stat().st_size
    end = size if end is None else min(end, size)
    if end <= start:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = ctypes.create_string_buffer(pages)
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            first, last = start // PAGE, (end + PAGE - 1) // PAGE
            return sum(vec.raw[i] & 1 for i in range(first, last)) * PAGE
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


async def _write(seg: Segment, megabytes: int) -> int:
    """Append ``megabytes`` MiB in entries of 64 KiB (one producer, sequence = position) and
    wait until all are durable."""
    last = -1
    first = seg.log.next_position
    for seq in range(first, first + megabytes * 16):
        last, _ = _append(seg, seq, 64 * 1024)
    await _until(lambda: seg.visible_position >= last, "the appends' sync")
    return last


def _active_file(seg: Segment) -> Path:
    return seg.log.files[-1].path


async def test_synced_bytes_before_the_window_leave_the_page_cache(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    seg = await _open(tmp_path / "seg", executor, page_cache_bytes=1 * MIB)
    await _write(seg, 8)
    path = _active_file(seg)
    size = path.stat().st_size
    assert size > 8 * MIB
    # The drop follows the sync that made the entries visible, on the syncer's thread.
    await _until(lambda: resident(path, 0, size - 3 * MIB) == 0, "the synced bytes' drop")
    assert resident(path, size - MIB // 2, size) > 0, "the window at the end stays cached"
    await seg.close()


async def test_without_a_window_the_kernel_keeps_what_was_written(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    """The control of the test above: the same writes with ``page_cache_bytes=0`` stay
    resident, so it is the log that drops them."""
    seg = await _open(tmp_path / "seg", executor, page_cache_bytes=0)
    await _write(seg, 8)
    path = _active_file(seg)
    assert resident(path) >= path.stat().st_size - PAGE
    await seg.close()


async def test_a_rolled_file_leaves_the_page_cache_whole(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    seg = await _open(tmp_path / "seg", executor, page_cache_bytes=8 * MIB, roll_bytes=2 * MIB)
    await _write(seg, 3)
    rolled = seg.log.files[0].path
    assert len(seg.log.files) >= 2 and rolled.stat().st_size >= 2 * MIB
    # The file was under the window, so only the roll can have dropped it; the syncer drops a
    # retired file with its next sync, which the next write brings.
    await _write(seg, 1)
    await _until(lambda: resident(rolled) == 0, "the rolled file's drop")
    await seg.close()


async def test_entries_read_back_after_their_pages_were_dropped(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    seg = await _open(tmp_path / "seg", executor, page_cache_bytes=1 * MIB, cache_bytes=MIB)
    last = await _write(seg, 4)
    path = _active_file(seg)
    await _until(lambda: resident(path, 0, MIB) == 0, "the first MiB's drop")
    records = seg.log.read(0, 4, 1 << 20)
    assert [p for p, _ in records] == [0, 1, 2, 3]
    assert all(len(entry) > 64 * 1024 for _, entry in records)
    assert seg.log.read(last, 1, 1 << 20)[0][0] == last
    await seg.close()

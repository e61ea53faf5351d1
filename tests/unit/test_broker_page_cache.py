"""A log leaves only the last ``page_cache_bytes`` of what it synced in the OS page cache.

What is resident is read from the kernel (``mincore`` on a mapping of the file), so these
tests see the pages themselves, not the writer's bookkeeping.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

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
    # The file was under the window, so only the roll can have dropped it; the syncer hands a
    # retired file to the drop thread with its next sync, which the next write brings.
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


class HeldDrops:
    """``os.posix_fadvise`` replaced by one that records the calling thread and its nice value
    and, while ``hold`` is clear, waits before it drops."""

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.hold.set()
        self.calls: list[tuple[int, int]] = []
        self.entered = threading.Event()

    def __call__(self, fd: int, offset: int, length: int, advice: int) -> None:
        tid = threading.get_native_id()
        self.calls.append((tid, os.getpriority(os.PRIO_PROCESS, tid)))
        self.entered.set()
        self.hold.wait(20)
        _real_fadvise(fd, offset, length, advice)


_real_fadvise = os.posix_fadvise


@pytest.fixture
def held_drops(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldDrops]:
    held = HeldDrops()
    monkeypatch.setattr(os, "posix_fadvise", held)
    try:
        yield held
    finally:
        held.hold.set()


async def test_acknowledgements_do_not_wait_for_a_drop(
    tmp_path: Path, executor: ThreadPoolExecutor, held_drops: HeldDrops
) -> None:
    """A drop takes milliseconds of kernel time (a rolled file's: 6-9 ms); the syncer hands it
    to the drop thread, so a held drop holds no sync and no acknowledgement."""
    seg = await _open(tmp_path / "seg", executor, page_cache_bytes=1 * MIB, roll_bytes=4 * MIB)
    held_drops.hold.clear()
    await _write(seg, 4)
    await _until(held_drops.entered.is_set, "the first drop")
    # Drops, a roll and a rolled file's drop queue behind the held one; every entry still
    # becomes visible, which here means synced.
    first = seg.log.next_position
    last = await _write(seg, 8)
    assert seg.visible_position >= last >= first
    assert len(seg.log.files) >= 3
    path = seg.log.files[0].path
    assert resident(path) > 0, "nothing was dropped while the drop was held"
    held_drops.hold.set()
    await _until(lambda: resident(path) == 0, "the held drops")
    await seg.close()


async def test_drops_run_on_one_thread_at_the_process_priority(
    tmp_path: Path, executor: ThreadPoolExecutor, held_drops: HeldDrops
) -> None:
    """One thread of its own, not the caller's, and not at a lower priority: it takes the GIL
    around each call, so a preempted low-priority drop thread would stall every thread."""
    seg = await _open(tmp_path / "seg", executor, page_cache_bytes=1 * MIB, roll_bytes=2 * MIB)
    for _ in range(4):  # each write one chunk: a file, a roll, and the next write's sync
        await _write(seg, 2)
    path = seg.log.files[0].path
    await _until(lambda: resident(path) == 0, "the rolled file's drop")
    assert len(held_drops.calls) >= 3
    threads = {tid for tid, _ in held_drops.calls}
    assert len(threads) == 1 and threading.get_native_id() not in threads
    assert {nice for _, nice in held_drops.calls} == {os.getpriority(os.PRIO_PROCESS, 0)}
    await seg.close()

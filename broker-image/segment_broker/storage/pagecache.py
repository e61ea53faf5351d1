"""Dropping a log's synced bytes from the OS page cache, away from the threads that acknowledge.

``posix_fadvise(DONTNEED)`` walks the range's pages and frees them: 1.3-2.5 ms for a 16 MiB step
and 6-9 ms for a rolled 256 MiB file with its last 64 MiB still resident (strace, one broker at
300k msg/s of 1 KB). Called on a log's syncer thread, every entry written meanwhile waited that
much longer for its ``fdatasync``: each roll (one every 0.85 s at that rate) held the syncer for
12-16 ms. One thread for the whole process does the drops instead, in the order they were asked
for (bench/README.md, issue 17, fourteenth round).

The thread keeps the process's CPU priority. A lower one (nice 19 was tried) makes it a priority
inversion: the thread takes the GIL around every call, and whenever the scheduler preempts it
there in favour of any other work on the core, every thread of the broker waits for it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

_dropper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="page-cache-drop")
"""Its thread starts with the first drop: a broker whose logs keep their pages has none."""


def drop_later(fd: int, offset: int = 0, length: int = 0) -> None:
    """Drop ``[offset, offset + length)`` of ``fd``'s file (``length`` 0: to its end) from the
    page cache on the process's drop thread, which then closes ``fd``: the caller hands its
    descriptor over (``os.dup`` one that stays in use). Only clean pages leave; a platform or
    filesystem without the call loses nothing but the hint."""
    try:
        _dropper.submit(_drop, fd, offset, length)
    except RuntimeError:
        # The interpreter is exiting: no more drops, but the descriptor is still closed, and a
        # log's syncer does not fail over a hint.
        _close(fd)


def _drop(fd: int, offset: int, length: int) -> None:
    try:
        with contextlib.suppress(OSError, AttributeError):
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        _close(fd)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError as exc:
        log.warning("page cache drop: closing descriptor %d failed: %s", fd, exc)

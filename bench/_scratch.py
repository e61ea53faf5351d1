"""One scratch directory per benchmark run, and the sweep of those that killed runs left behind.

A run's data can be tens of gigabytes, and a run killed with SIGKILL (or by the end of a
session) never reaches its ``finally``. So every run puts its temporary directories under one
``bench-run-<pid>-*`` directory of ``$TMPDIR`` and holds an exclusive ``flock`` on a file in it
for as long as it lives; the kernel drops that lock when the process dies, however it dies. A
new run removes every such directory whose lock it can take: a live run's lock cannot be taken,
so a second run never sweeps the first one's data (a PID check could, once the PID is reused).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

PREFIX = "bench-run-"
LOCK = ".lock"


def sweep(parent: Path) -> list[Path]:
    """Remove the scratch directories under ``parent`` that no live run holds; returns them."""
    removed: list[Path] = []
    for directory in sorted(parent.glob(f"{PREFIX}*")):
        lock_path = directory / LOCK
        try:
            fd = os.open(lock_path, os.O_RDWR)
        except FileNotFoundError:
            continue  # not (or not yet) a run's directory: its owner may be creating it
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
        finally:
            os.close(fd)
    return removed


@contextlib.contextmanager
def scratch_root() -> Iterator[Path]:
    """Sweep what killed runs left, then make this run's directory the process's (and its
    children's) temporary directory until the block ends, when it is removed."""
    parent = Path(tempfile.gettempdir())
    for directory in sweep(parent):
        print(f"[bench] removed {directory}, left by a run that was killed", flush=True)
    root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=parent))
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    saved_tempdir, saved_env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = str(root)
    os.environ["TMPDIR"] = str(root)
    try:
        yield root
    finally:
        tempfile.tempdir = saved_tempdir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(root, ignore_errors=True)
        os.close(fd)

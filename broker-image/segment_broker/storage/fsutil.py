"""Small durable-filesystem helpers (atomic replace with directory fsync)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def fsync_dir(directory: Path) -> None:
    """Make a directory's entries (created, renamed or deleted files) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old or the new content:
    temporary file, fsync, rename over the target, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_json(path: Path, body: Any) -> None:
    atomic_write_bytes(path, json.dumps(body, separators=(",", ":"), sort_keys=True).encode())


def read_json(path: Path) -> Any:
    with open(path, "rb") as fh:
        return json.loads(fh.read())

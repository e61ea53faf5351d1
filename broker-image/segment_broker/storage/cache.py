"""The most recent entries of a segment in memory, so that consumers keeping up read no file."""

from __future__ import annotations

from typing import Any


class EntryCache:
    """Entries at positions ``base`` .. ``base + len(entries) - 1``, appended as they are staged.
    Beyond ``limit`` bytes the oldest acknowledged entries are dropped down to half of it (an
    entry not yet acknowledged stays: the log may not have it on disk yet)."""

    def __init__(self, limit: int) -> None:
        self.entries: list[bytes | memoryview] = []
        self.base = 0
        self.bytes = 0
        self.limit = limit
        """Bytes kept; the store shares its budget among the segments."""

    def add(self, entry: bytes | memoryview, visible_position: int) -> None:
        self.entries.append(entry)
        self.bytes += len(entry)
        if self.bytes > self.limit:
            self.evict(visible_position)

    def evict(self, visible_position: int) -> None:
        target = self.limit // 2
        dropped = 0
        k = 0
        cache = self.entries
        limit = visible_position - self.base
        while self.bytes - dropped > target and k < len(cache) and k <= limit:
            dropped += len(cache[k])
            k += 1
        if k:
            del cache[:k]
            self.base += k
            self.bytes -= dropped

    def read(
        self, position: int, last: int, max_entries: int, max_bytes: int
    ) -> list[tuple[int, Any]]:
        """Entries from ``position`` (at least ``base``) up to ``last``: at most
        ``max_entries``, and no more than ``max_bytes`` unless the first alone is larger."""
        i = position - self.base
        stop = min(i + max_entries, last + 1 - self.base)
        out: list[tuple[int, Any]] = []
        total = 0
        cache = self.entries
        while i < stop:
            e = cache[i]
            total += len(e)
            if out and total > max_bytes:
                break
            out.append((self.base + i, e))
            i += 1
        return out

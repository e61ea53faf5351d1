"""Key hashing (DESIGN §3): one murmur3 hash feeds both the segment ring and the entry-bucket ring.

The upper 16 bits pick the segment, the lower 16 bits pick the entry bucket, so the two choices
are independent and a split never changes which bucket a key falls in.
"""

from __future__ import annotations

import mmh3

RING_SIZE = 0x10000
RING_MAX = 0xFFFF


def _as_bytes(key: str | bytes) -> bytes:
    return key.encode("utf-8") if isinstance(key, str) else key


def key_hash(key: str | bytes) -> int:
    """Unsigned 32-bit MurmurHash3 x86_32 of the UTF-8 key, seed 0."""
    return int(mmh3.hash(_as_bytes(key), 0, signed=False))


def segment_hash(key: str | bytes) -> int:
    """Position of the key on the 16-bit segment ring."""
    return key_hash(key) >> 16


def bucket_hash(key: str | bytes) -> int:
    """Position of the key on the 16-bit entry-bucket ring (PIP-486 ``hashB``)."""
    return key_hash(key) & 0xFFFF


def shard_of(namespace: str, name: str, shards: int) -> int:
    """The leadership shard of a topic: ``mmh3("<ns>/<name>") % shards`` (DESIGN §4)."""
    if shards < 1:
        raise ValueError(f"shard count must be at least 1, got {shards}")
    return key_hash(f"{namespace}/{name}") % shards

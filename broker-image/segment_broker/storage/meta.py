"""A segment's identity and settings (``segment.json``), its retention policy and its seal
(``sealed.json``): the records of the directory layout described in :mod:`.segment`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from scalable_topics.core.layout import HashRange, SegmentInfo, descriptor

FsyncMode = Literal["always", "interval"]
SUBSCRIPTION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
FENCE_FILE = "fenced.json"


@dataclass(frozen=True)
class StorageSettings:
    fsync: FsyncMode = "always"
    fsync_interval_ms: int = 50
    roll_bytes: int = 256 * 1024 * 1024
    index_interval: int = 64 * 1024
    cache_bytes: int = 16 * 1024 * 1024
    cursor_flush_ms: int = 100
    page_cache_bytes: int = 64 * 1024 * 1024
    """Synced bytes of a log's active file left in the OS page cache (``LogWriter``); 0: all."""


@dataclass(frozen=True)
class Retention:
    time_ms: int | None = None
    size_bytes: int | None = None

    def to_json(self) -> dict[str, int | None]:
        return {"timeMs": self.time_ms, "sizeBytes": self.size_bytes}

    @classmethod
    def from_json(cls, body: dict[str, Any] | None) -> Retention:
        body = body or {}
        t = body.get("timeMs")
        s = body.get("sizeBytes")
        for name, v in (("timeMs", t), ("sizeBytes", s)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"retention.{name} must be a non-negative integer")
        return cls(time_ms=t, size_bytes=s)


@dataclass(frozen=True)
class SegmentMeta:
    namespace: str
    topic: str
    segment_id: int
    range_start: int
    range_end: int
    buckets: int
    created_at: float
    retention: Retention = field(default_factory=Retention)

    @property
    def descriptor(self) -> str:
        """``%04x-%04x-%d``: the segment's directory name (DESIGN §3)."""
        return descriptor(SegmentInfo(self.segment_id, HashRange(self.range_start, self.range_end)))

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "topic": self.topic,
            "segmentId": self.segment_id,
            "range": {"start": self.range_start, "end": self.range_end},
            "buckets": self.buckets,
            "createdAt": self.created_at,
            "retention": self.retention.to_json(),
        }

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> SegmentMeta:
        return cls(
            namespace=str(body["namespace"]),
            topic=str(body["topic"]),
            segment_id=int(body["segmentId"]),
            range_start=int(body["range"]["start"]),
            range_end=int(body["range"]["end"]),
            buckets=int(body["buckets"]),
            created_at=float(body["createdAt"]),
            retention=Retention.from_json(body.get("retention")),
        )


@dataclass(frozen=True)
class SealInfo:
    last_position: int
    successors: list[dict[str, Any]]
    sealed_at: float
    open: tuple[int, ...] = ()
    """Successors hosted beside this segment that its broker opens once the seal is durable:
    recorded with the seal, so that their opening needs no durable write of its own (a child
    found fenced on recovery, though named here, is opened then)."""

    def to_json(self) -> dict[str, Any]:
        """The seal as producers, the admin API and a transfer see it."""
        return {
            "lastPosition": self.last_position,
            "successors": self.successors,
            "sealedAt": self.sealed_at,
        }

    def to_marker(self) -> dict[str, Any]:
        """The seal as ``sealed.json`` holds it: with the children this broker opened."""
        return {**self.to_json(), "open": list(self.open)} if self.open else self.to_json()

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> SealInfo:
        return cls(
            last_position=int(body["lastPosition"]),
            successors=list(body.get("successors", [])),
            sealed_at=float(body.get("sealedAt", 0.0)),
            open=tuple(int(sid) for sid in body.get("open", ())),
        )

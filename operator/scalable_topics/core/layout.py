"""The segment DAG (DESIGN §3, PIP-468's ``SegmentLayout``).

A layout is an immutable, versioned snapshot: every change returns a new layout whose epoch is
one higher. Active segments always partition the 16-bit hash ring; sealed segments stay in the
DAG (with their parent/child links) until they are pruned, so readers can follow a key's history.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import Any

from .hashing import RING_MAX

_HEX_RANGE = re.compile(r"([0-9a-fA-F]{4})-([0-9a-fA-F]{4})")

__all__ = [
    "HashRange",
    "SegmentInfo",
    "SegmentLayout",
    "SegmentState",
    "descriptor",
]


@dataclass(frozen=True, order=True, slots=True)
class HashRange:
    """An inclusive range ``[start, end]`` of the 16-bit hash ring."""

    start: int
    end: int

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"hash range {name} must be an integer, got {value!r}")
        if not 0 <= self.start <= self.end <= RING_MAX:
            raise ValueError(
                f"invalid hash range [{self.start}, {self.end}]: "
                f"need 0 <= start <= end <= 0x{RING_MAX:04x}"
            )

    @classmethod
    def full(cls) -> HashRange:
        return cls(0, RING_MAX)

    @property
    def size(self) -> int:
        """Number of hash values in the range."""
        return self.end - self.start + 1

    def contains(self, hash_value: int) -> bool:
        return self.start <= hash_value <= self.end

    def midpoint(self) -> int:
        """The default split point: the last hash of the lower half."""
        return self.start + (self.end - self.start) // 2

    def split(self, at: int | None = None) -> tuple[HashRange, HashRange]:
        """Split into ``[start, at]`` and ``[at+1, end]``; ``at`` defaults to the midpoint."""
        if self.size == 1:
            raise ValueError(f"hash range {self.hex()} has size 1 and cannot be split")
        point = self.midpoint() if at is None else at
        if not self.start <= point < self.end:
            raise ValueError(
                f"split point 0x{point:04x} is outside hash range {self.hex()} "
                "(need start <= at < end)"
            )
        return HashRange(self.start, point), HashRange(point + 1, self.end)

    def is_adjacent_to(self, other: HashRange) -> bool:
        return self.end + 1 == other.start or other.end + 1 == self.start

    def merge(self, other: HashRange) -> HashRange:
        if not self.is_adjacent_to(other):
            raise ValueError(f"hash ranges {self.hex()} and {other.hex()} are not adjacent")
        return HashRange(min(self.start, other.start), max(self.end, other.end))

    def hex(self) -> str:
        return f"{self.start:04x}-{self.end:04x}"

    @classmethod
    def from_hex(cls, text: str) -> HashRange:
        match = _HEX_RANGE.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"hash range {text!r} is not of the form 'ssss-eeee' (4 hex digits)")
        return cls(int(match.group(1), 16), int(match.group(2), 16))

    def to_dict(self) -> dict[str, int]:
        return {"start": self.start, "end": self.end}

    def __str__(self) -> str:
        return self.hex()


class SegmentState(enum.StrEnum):
    ACTIVE = "ACTIVE"
    SEALED = "SEALED"


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One node of the DAG. ``sealed_at_epoch`` is 0 while the segment is active."""

    segment_id: int
    hash_range: HashRange
    state: SegmentState = SegmentState.ACTIVE
    parent_ids: tuple[int, ...] = ()
    child_ids: tuple[int, ...] = ()
    created_at_epoch: int = 0
    sealed_at_epoch: int = 0

    @property
    def active(self) -> bool:
        return self.state is SegmentState.ACTIVE

    @property
    def descriptor(self) -> str:
        return descriptor(self)

    def to_metadata(self) -> dict[str, Any]:
        return {
            "segmentId": self.segment_id,
            "hashRange": self.hash_range.to_dict(),
            "state": self.state.value,
            "parentIds": list(self.parent_ids),
            "childIds": list(self.child_ids),
            "createdAtEpoch": self.created_at_epoch,
            "sealedAtEpoch": self.sealed_at_epoch,
        }

    @classmethod
    def from_metadata(cls, data: Mapping[str, Any]) -> SegmentInfo:
        if not isinstance(data, Mapping):
            raise ValueError(f"malformed segment metadata {data!r}: not an object")
        try:
            hash_range = data["hashRange"]
            state = SegmentState(str(data.get("state", "ACTIVE")).upper())
            sealed_at = data.get("sealedAtEpoch")
            sealed_at_epoch = 0 if sealed_at is None or int(sealed_at) < 0 else int(sealed_at)
            if state is SegmentState.ACTIVE and sealed_at_epoch != 0:
                raise ValueError(
                    f"segment {data.get('segmentId')} is ACTIVE but has sealedAtEpoch "
                    f"{sealed_at_epoch}"
                )
            return cls(
                segment_id=int(data["segmentId"]),
                hash_range=HashRange(int(hash_range["start"]), int(hash_range["end"])),
                state=state,
                parent_ids=tuple(int(p) for p in data.get("parentIds") or ()),
                child_ids=tuple(int(c) for c in data.get("childIds") or ()),
                created_at_epoch=int(data.get("createdAtEpoch") or 0),
                sealed_at_epoch=sealed_at_epoch,
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed segment metadata {dict(data)!r}: {exc!r}") from None


def descriptor(segment: SegmentInfo) -> str:
    """The segment's stable name on brokers and in logs, e.g. ``0000-7fff-1``."""
    return f"{segment.hash_range.start:04x}-{segment.hash_range.end:04x}-{segment.segment_id}"


@dataclass(frozen=True)
class SegmentLayout:
    """Immutable snapshot of a topic's segment DAG."""

    epoch: int
    next_segment_id: int
    segments: Mapping[int, SegmentInfo]
    properties: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", MappingProxyType(dict(self.segments)))
        object.__setattr__(self, "properties", MappingProxyType(dict(self.properties)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SegmentLayout):
            return NotImplemented
        return (
            self.epoch == other.epoch
            and self.next_segment_id == other.next_segment_id
            and dict(self.segments) == dict(other.segments)
            and dict(self.properties) == dict(other.properties)
        )

    def __hash__(self) -> int:
        return hash((self.epoch, self.next_segment_id, tuple(sorted(self.segments))))

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def initial(cls, n: int) -> SegmentLayout:
        """``n`` equal segments; the last one takes the remainder of the ring."""
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= RING_MAX + 1:
            raise ValueError(f"initial segment count must be between 1 and 65536, got {n!r}")
        size = (RING_MAX + 1) // n
        segments = {}
        for i in range(n):
            end = RING_MAX if i == n - 1 else i * size + size - 1
            segments[i] = SegmentInfo(i, HashRange(i * size, end))
        return cls(epoch=0, next_segment_id=n, segments=segments)

    # -- queries ------------------------------------------------------------------------------

    @cached_property
    def _active_sorted(self) -> tuple[SegmentInfo, ...]:
        return tuple(
            sorted(
                (s for s in self.segments.values() if s.active),
                key=lambda s: s.hash_range.start,
            )
        )

    @cached_property
    def _active_starts(self) -> tuple[int, ...]:
        return tuple(s.hash_range.start for s in self._active_sorted)

    def active(self) -> list[SegmentInfo]:
        """Active segments sorted by range start."""
        return list(self._active_sorted)

    def get(self, segment_id: int) -> SegmentInfo:
        try:
            return self.segments[segment_id]
        except KeyError:
            raise ValueError(
                f"segment {segment_id} not found in layout epoch {self.epoch}"
            ) from None

    def find_active(self, hash_value: int) -> SegmentInfo:
        """The active segment whose range holds ``hash_value`` (a 16-bit segment hash)."""
        if not 0 <= hash_value <= RING_MAX:
            raise ValueError(f"hash 0x{hash_value:x} is outside the 16-bit ring")
        index = bisect.bisect_right(self._active_starts, hash_value) - 1
        if index >= 0:
            candidate = self._active_sorted[index]
            if candidate.hash_range.contains(hash_value):
                return candidate
        raise ValueError(f"no active segment holds hash 0x{hash_value:04x} (layout is broken)")

    def parents(self, segment_id: int) -> list[int]:
        return list(self.get(segment_id).parent_ids)

    def children(self, segment_id: int) -> list[int]:
        return list(self.get(segment_id).child_ids)

    def _closure(self, segment_id: int, links: str) -> set[int]:
        seen: set[int] = set()
        stack = list(getattr(self.get(segment_id), links))
        while stack:
            current = stack.pop()
            if current in seen or current not in self.segments:
                continue
            seen.add(current)
            stack.extend(getattr(self.segments[current], links))
        return seen

    def ancestors(self, segment_id: int) -> set[int]:
        return self._closure(segment_id, "parent_ids")

    def descendants(self, segment_id: int) -> set[int]:
        return self._closure(segment_id, "child_ids")

    def _topological(self, ids: Iterable[int]) -> list[int]:
        # A child is always created in a later epoch than each of its parents.
        return sorted(ids, key=lambda i: (self.segments[i].created_at_epoch, i))

    def lineage(self, segment_id: int) -> list[int]:
        """Ancestors, the segment, then descendants; every parent before its children."""
        self.get(segment_id)
        return [
            *self._topological(self.ancestors(segment_id)),
            segment_id,
            *self._topological(self.descendants(segment_id)),
        ]

    def merge_depth(self, segment_id: int) -> int:
        """How many merge-created segments (two or more parents) the segment descends from,
        itself included."""
        ids = self.ancestors(segment_id) | {segment_id}
        return sum(1 for i in ids if len(self.segments[i].parent_ids) >= 2)

    # -- changes ------------------------------------------------------------------------------

    def _active_or_raise(self, segment_id: int, operation: str) -> SegmentInfo:
        if segment_id not in self.segments:
            raise ValueError(f"cannot {operation} segment {segment_id}: not found")
        segment = self.segments[segment_id]
        if not segment.active:
            raise ValueError(
                f"cannot {operation} segment {descriptor(segment)}: it is {segment.state.value}, "
                "not ACTIVE"
            )
        return segment

    def split(self, segment_id: int, at: int | None = None) -> SegmentLayout:
        parent = self._active_or_raise(segment_id, "split")
        if parent.hash_range.size == 1:
            raise ValueError(f"cannot split segment {descriptor(parent)}: its range has size 1")
        try:
            lower_range, upper_range = parent.hash_range.split(at)
        except ValueError as exc:
            raise ValueError(f"cannot split segment {descriptor(parent)}: {exc}") from None
        epoch = self.epoch + 1
        lower_id, upper_id = self.next_segment_id, self.next_segment_id + 1
        segments = dict(self.segments)
        segments[segment_id] = replace(
            parent,
            state=SegmentState.SEALED,
            child_ids=(lower_id, upper_id),
            sealed_at_epoch=epoch,
        )
        for child_id, child_range in ((lower_id, lower_range), (upper_id, upper_range)):
            segments[child_id] = SegmentInfo(
                child_id, child_range, parent_ids=(segment_id,), created_at_epoch=epoch
            )
        return SegmentLayout(epoch, self.next_segment_id + 2, segments, self.properties)

    def merge(self, *segment_ids: int) -> SegmentLayout:
        if len(segment_ids) < 2:
            raise ValueError(f"cannot merge {list(segment_ids)}: need two or more segments")
        if len(set(segment_ids)) != len(segment_ids):
            raise ValueError(f"cannot merge {list(segment_ids)}: a segment is named twice")
        parents = [self._active_or_raise(i, "merge") for i in segment_ids]
        ordered = sorted(parents, key=lambda s: s.hash_range.start)
        for left, right in itertools.pairwise(ordered):
            if left.hash_range.end + 1 != right.hash_range.start:
                raise ValueError(
                    f"cannot merge segments {descriptor(left)} and {descriptor(right)}: "
                    "their ranges are not adjacent"
                )
        epoch = self.epoch + 1
        child_id = self.next_segment_id
        segments = dict(self.segments)
        for parent in parents:
            segments[parent.segment_id] = replace(
                parent, state=SegmentState.SEALED, child_ids=(child_id,), sealed_at_epoch=epoch
            )
        segments[child_id] = SegmentInfo(
            child_id,
            HashRange(ordered[0].hash_range.start, ordered[-1].hash_range.end),
            parent_ids=tuple(segment_ids),
            created_at_epoch=epoch,
        )
        return SegmentLayout(epoch, child_id + 1, segments, self.properties)

    def prune(self, segment_id: int) -> SegmentLayout:
        """Drop a sealed segment (drained and out of retention) and the links to it."""
        segment = self.get(segment_id)
        if segment.active:
            raise ValueError(f"cannot prune segment {descriptor(segment)}: it is still ACTIVE")
        segments = {}
        for other_id, other in self.segments.items():
            if other_id == segment_id:
                continue
            if segment_id in other.parent_ids or segment_id in other.child_ids:
                other = replace(
                    other,
                    parent_ids=tuple(p for p in other.parent_ids if p != segment_id),
                    child_ids=tuple(c for c in other.child_ids if c != segment_id),
                )
            segments[other_id] = other
        return SegmentLayout(self.epoch + 1, self.next_segment_id, segments, self.properties)

    def with_properties(self, **properties: str) -> SegmentLayout:
        """Same DAG with properties added or replaced (not a DAG change: epoch unchanged)."""
        return SegmentLayout(
            self.epoch, self.next_segment_id, self.segments, {**self.properties, **properties}
        )

    # -- metadata (PIP-468 JSON) --------------------------------------------------------------

    def to_metadata(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "nextSegmentId": self.next_segment_id,
            "segments": {str(i): self.segments[i].to_metadata() for i in sorted(self.segments)},
            "properties": dict(self.properties),
        }

    @classmethod
    def from_metadata(cls, data: Mapping[str, Any]) -> SegmentLayout:
        """Load PIP-468 metadata, checking that it describes a well-formed DAG."""
        try:
            epoch = int(data["epoch"])
            next_segment_id = int(data["nextSegmentId"])
            raw_segments = data["segments"]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed layout metadata: missing {exc}") from None
        if not isinstance(raw_segments, Mapping):
            raise ValueError(f"malformed layout metadata: segments is {raw_segments!r}")
        segments: dict[int, SegmentInfo] = {}
        for key, raw in raw_segments.items():
            info = SegmentInfo.from_metadata(raw)
            if int(key) != info.segment_id:
                raise ValueError(f"segment key {key} does not match segmentId {info.segment_id}")
            segments[info.segment_id] = info
        properties = {str(k): str(v) for k, v in dict(data.get("properties") or {}).items()}
        layout = cls(epoch, next_segment_id, segments, properties)
        layout.validate()
        return layout

    def validate(self) -> None:
        """Raise ``ValueError`` unless the active segments partition the ring, ids are sane and
        every parent/child link is recorded on both sides."""
        if self.segments and max(self.segments) >= self.next_segment_id:
            raise ValueError(
                f"nextSegmentId {self.next_segment_id} is not above the largest segment id "
                f"{max(self.segments)}"
            )
        for segment in self.segments.values():
            for parent in segment.parent_ids:
                if segment.segment_id not in getattr(self.segments.get(parent), "child_ids", ()):
                    raise ValueError(
                        f"segment {segment.segment_id} names parent {parent}, which does not "
                        "list it as a child"
                    )
            for child in segment.child_ids:
                if segment.segment_id not in getattr(self.segments.get(child), "parent_ids", ()):
                    raise ValueError(
                        f"segment {segment.segment_id} names child {child}, which does not "
                        "list it as a parent"
                    )
        expected_start = 0
        for segment in self._active_sorted:
            if segment.hash_range.start != expected_start:
                kind = "gap" if segment.hash_range.start > expected_start else "overlap"
                raise ValueError(
                    f"active segments do not partition the ring: {kind} at 0x{expected_start:04x} "
                    f"(segment {descriptor(segment)})"
                )
            expected_start = segment.hash_range.end + 1
        if expected_start != RING_MAX + 1:
            raise ValueError(
                f"active segments do not partition the ring: gap at 0x{expected_start:04x}"
            )

"""Retention of sealed segments: which ones the leader may prune from the DAG (DESIGN §3
``SegmentLayout.prune``, ``spec.retention`` in docs/resources.md).

Pure: the controller gathers the facts (when each segment was sealed, which ones every
subscription has consumed, their stored sizes) and this module decides.

The rules, each of which keeps a segment someone may still need:

* only a **sealed** segment is ever pruned, and only one that is **drained**: its broker says
  that every subscription it holds has acknowledged everything up to the seal;
* only a **root** (no parent left in the DAG) is pruned, so the DAG is trimmed from its oldest
  end and every segment that stays keeps its whole retained history. A parent is sealed before
  its children, so this is also oldest first;
* each of its children is in the layout (a split or merge that sealed it has committed);
* without a retention rule nothing is pruned (``None`` keeps everything: the safe default); with
  ``time`` a drained root is pruned once ``sealed_at + time`` has passed; with ``size`` drained
  roots are pruned oldest first while the drained sealed segments together are larger than
  ``size``. With both, either limit prunes (as Pulsar's retention of acknowledged data).

A segment whose seal time is unknown is never pruned.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from .layout import SegmentLayout

__all__ = [
    "RetentionRule",
    "SegmentDrains",
    "drains_from_stats",
    "next_expiry",
    "prunable",
]


@dataclass(frozen=True, slots=True)
class RetentionRule:
    """``spec.retention`` in the core's units: seconds after the seal, bytes."""

    time: float | None = None
    size: int | None = None

    def __post_init__(self) -> None:
        for name in ("time", "size"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise ValueError(f"retention {name} must be a finite number >= 0, got {value!r}")

    @property
    def enabled(self) -> bool:
        return self.time is not None or self.size is not None


@dataclass(frozen=True, slots=True)
class SegmentDrains:
    """One segment's consumption as its broker reports it (``GET /admin/v1/segments/...``).

    ``drained`` and ``undrained`` name the subscriptions the broker holds on the segment. A
    subscription is drained when the segment is sealed and its cursor's acknowledgement floor is
    past the seal's last position (the broker's ``drained`` flag).
    """

    sealed: bool
    drained: frozenset[str] = frozenset()
    undrained: frozenset[str] = frozenset()
    size: int = 0
    sealed_at: float | None = None

    @property
    def fully_drained(self) -> bool:
        """Sealed and nothing left for any subscription it holds (vacuously true without any:
        a subscription created after the seal never had a cursor here, so nothing to read)."""
        return self.sealed and not self.undrained


def drains_from_stats(stats: Mapping[str, Any]) -> SegmentDrains:
    """Read the broker's segment stats (docs/protocol.md, admin ``GET`` of a segment): ``sealed``,
    ``seal.sealedAt``, ``log.bytes`` and, per subscription, ``drained`` (with ``backlog`` 0 and
    ``ackFloor`` past ``seal.lastPosition`` as the fallback when a broker omits the flag)."""
    seal = stats.get("seal") if isinstance(stats.get("seal"), Mapping) else None
    sealed = bool(stats.get("sealed")) or seal is not None
    last = _int(seal.get("lastPosition")) if seal is not None else None
    drained: set[str] = set()
    undrained: set[str] = set()
    subscriptions = stats.get("subscriptions")
    for name, info in (subscriptions if isinstance(subscriptions, Mapping) else {}).items():
        info = info if isinstance(info, Mapping) else {}
        flag = info.get("drained")
        if flag is None:
            floor = _int(info.get("ackFloor"))
            flag = (
                sealed
                and last is not None
                and floor is not None
                and floor > last
                and _int(info.get("backlog")) == 0
            )
        (drained if sealed and flag is True else undrained).add(str(name))
    log = stats.get("log")
    size = _int(log.get("bytes")) if isinstance(log, Mapping) else None
    sealed_at = seal.get("sealedAt") if seal is not None else None
    return SegmentDrains(
        sealed=sealed,
        drained=frozenset(drained),
        undrained=frozenset(undrained),
        size=max(0, size or 0),
        sealed_at=float(sealed_at)
        if isinstance(sealed_at, int | float) and not isinstance(sealed_at, bool) and sealed_at > 0
        else None,
    )


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _root(layout: SegmentLayout, segment_id: int) -> bool:
    return not any(p in layout.segments for p in layout.segments[segment_id].parent_ids)


def _candidate(
    layout: SegmentLayout,
    segment_id: int,
    sealed_at: Mapping[int, float],
    drained: Collection[int],
) -> bool:
    segment = layout.segments.get(segment_id)
    return (
        segment is not None
        and not segment.active
        and segment_id in drained
        and segment_id in sealed_at
        and _root(layout, segment_id)
        and all(c in layout.segments for c in segment.child_ids)
    )


def prunable(
    layout: SegmentLayout,
    sealed_at: Mapping[int, float],
    drained: Collection[int],
    retention: RetentionRule | None,
    now: float,
    sizes: Mapping[int, int] | None = None,
) -> list[int]:
    """The segments to prune now, parents first: apply ``layout.prune`` in this order.

    ``sealed_at`` maps a sealed segment to its seal time (Unix seconds); ``drained`` holds the
    segments that every subscription has consumed completely; ``sizes`` the stored bytes of
    segments (unknown counts as 0, which can only prune less).
    """
    if retention is None or not retention.enabled:
        return []
    sizes = sizes or {}
    total = sum(
        max(0, sizes.get(i, 0)) for i, s in layout.segments.items() if not s.active and i in drained
    )
    heap = [(sealed_at[i], i) for i in layout.segments if _candidate(layout, i, sealed_at, drained)]
    heapq.heapify(heap)
    current = layout
    pruned: list[int] = []
    while heap:
        sealed, segment_id = heapq.heappop(heap)
        expired = retention.time is not None and now >= sealed + retention.time
        oversize = retention.size is not None and total > retention.size
        if not (expired or oversize):
            # The heap is oldest first: a younger root is neither expired nor needed to get
            # under the size limit, which this one did not change.
            break
        children = current.segments[segment_id].child_ids
        current = current.prune(segment_id)
        pruned.append(segment_id)
        total -= max(0, sizes.get(segment_id, 0))
        for child in children:
            if _candidate(current, child, sealed_at, drained):
                heapq.heappush(heap, (sealed_at[child], child))
    return pruned


def next_expiry(
    layout: SegmentLayout,
    sealed_at: Mapping[int, float],
    retention: RetentionRule | None,
    now: float,
) -> float | None:
    """The earliest future instant at which a sealed segment of ``layout`` reaches
    ``retention.time`` (when the leader should look again), or ``None``."""
    if retention is None or retention.time is None:
        return None
    instants = [
        sealed_at[i] + retention.time
        for i, s in layout.segments.items()
        if not s.active and i in sealed_at and sealed_at[i] + retention.time > now
    ]
    return min(instants, default=None)

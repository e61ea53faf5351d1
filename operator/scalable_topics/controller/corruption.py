"""Corrupted segments on the topic: a broker that quarantines a segment writes
``Segment.status.corruption``; the topic's leader turns it into ``Ready=False`` and
``Stalled=True`` with reason ``SegmentCorrupted`` (a person has to decide what is lost) and a
Warning event, and back to Ready once the broker cleared it (docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..core.jsontypes import JsonView
from ..core.resources import Reason


def corruption_of(segment: JsonView | None) -> Mapping[str, Any] | None:
    found = ((segment or {}).get("status") or {}).get("corruption")
    return found if isinstance(found, Mapping) else None


def corruption_changed(before: JsonView | None, after: JsonView) -> bool:
    """Whether a Segment event changed its corruption report (a topic pass is then due)."""
    return corruption_of(before) != corruption_of(after)


def corrupted_segments(segments: Iterable[JsonView]) -> tuple[str, str] | None:
    """``(reason, message)`` for the topic when some of its Segments are quarantined."""
    found: list[tuple[int, str, Mapping[str, Any]]] = []
    for segment in segments:
        corruption = corruption_of(segment)
        if corruption is not None:
            meta = segment.get("metadata") or {}
            sid = int((segment.get("spec") or {}).get("segmentId", -1))
            found.append((sid, str(meta.get("name", sid)), corruption))
    if not found:
        return None
    details = "; ".join(
        f"{name} at position {c.get('position')} ({c.get('reason')}, {c.get('file')} offset "
        f"{c.get('offset')})"
        for _, name, c in sorted(found, key=lambda item: item[0])
    )
    return (
        Reason.SEGMENT_CORRUPTED,
        f"quarantined for a damaged log, appends refused, nothing served from the position on: "
        f"{details}. The data is kept as it is; docs/operations.md (Corrupted segments) says "
        "how to recover",
    )

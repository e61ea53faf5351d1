"""A text drawing of the segment DAG for ``kubectl describe`` and ``stopic dag``.

A DAG with merges is not a tree, so instead of a tree it is drawn as its history (one line per
epoch that changed it) followed by the ring as the active segments cut it today. Both read well
in a terminal and in ``status.dag``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from .layout import SegmentInfo, SegmentLayout

RING_WIDTH = 64


def _label(segment: SegmentInfo) -> str:
    return f"#{segment.segment_id} {segment.hash_range.hex()}"


def _change_line(layout: SegmentLayout, epoch: int, children: list[SegmentInfo]) -> str:
    parent_ids = sorted(
        {p for c in children for p in c.parent_ids},
        key=lambda p: (layout.segments[p].hash_range.start if p in layout.segments else -1, p),
    )
    parents = " + ".join(
        _label(layout.segments[p]) if p in layout.segments else f"#{p} (pruned)" for p in parent_ids
    )
    targets = ", ".join(_label(c) for c in sorted(children, key=lambda c: c.hash_range.start))
    if len(parent_ids) == 1 and len(children) == 1:
        verb = "rebucket"
    elif len(parent_ids) > 1:
        verb = "merge"
    else:
        verb = "split"
    return f"  epoch {epoch:>3}  {verb:<8} {parents} -> {targets}"


def _ring(active: list[SegmentInfo]) -> str:
    """Active segments drawn to scale on a fixed-width ring (each gets at least one cell)."""
    cells: list[str] = []
    for segment in active:
        width = max(1, round(segment.hash_range.size * RING_WIDTH / 0x10000))
        name = f"#{segment.segment_id}"
        if width >= len(name) + 2:
            pad = width - len(name)
            cells.append("-" * (pad // 2) + name + "-" * (pad - pad // 2))
        else:
            cells.append("-" * width)
    return "  0000 |" + "|".join(cells) + "| ffff"


def _rate(value: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


def render_dag(
    layout: SegmentLayout,
    *,
    rates_in: Mapping[int, float] | None = None,
    backlog: Mapping[int, int] | None = None,
) -> str:
    active = layout.active()
    lines = [
        f"epoch {layout.epoch}, {len(active)} active, {len(layout.segments)} in DAG, "
        f"next id {layout.next_segment_id}"
    ]
    by_epoch: dict[int, list[SegmentInfo]] = defaultdict(list)
    for segment in layout.segments.values():
        by_epoch[segment.created_at_epoch].append(segment)
    roots = sorted(
        (s for s in layout.segments.values() if not s.parent_ids),
        key=lambda s: s.hash_range.start,
    )
    if roots:
        lines.append("  epoch   0  create   " + ", ".join(_label(s) for s in roots))
    for epoch in sorted(e for e in by_epoch if e > 0):
        children = [s for s in by_epoch[epoch] if s.parent_ids]
        if children:
            lines.append(_change_line(layout, epoch, children))
    lines.append(_ring(active))
    for segment in active:
        extras = []
        if rates_in is not None and segment.segment_id in rates_in:
            extras.append(f"in {_rate(rates_in[segment.segment_id])} msg/s")
        if backlog is not None and segment.segment_id in backlog:
            extras.append(f"backlog {backlog[segment.segment_id]}")
        suffix = f"  ({', '.join(extras)})" if extras else ""
        lines.append(f"  active  {segment.descriptor}{suffix}")
    return "\n".join(lines)

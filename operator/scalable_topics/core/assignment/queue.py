"""Queue subscriptions: :class:`QueueCoordinator` hands out ``(segment, bucket)`` units to
ordered queue workers (PIP-486)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..layout import SegmentLayout
from ..subscriptions import SubscriptionType
from .base import Coordinator
from .model import (
    DEFAULT_GRACE_PERIOD,
    Unit,
    bucket_slices,
)


class QueueCoordinator(Coordinator[Unit]):
    """Assignment of the entry buckets of a Queue subscription's segments to its queue
    consumers (PIP-486): every ``(segment, bucket)`` unit of a tracked segment has exactly one
    consumer, balanced to within one consumable unit per connected consumer, moving as few
    units as possible. Units of sealed segments move too (a sealed backlog fans out); a new
    segment's units go next to the other units of the segment, else near its parents' units.

    ``buckets`` are the segments' bucket counts (from the DAG); a segment whose count is not
    known yet is tracked (its children stay gated) but not assigned until it is
    (:meth:`buckets_changed`, or ``layout_changed(..., buckets=)``).
    """

    _sealed_movable = True
    _spread_pending = True

    def __init__(
        self,
        layout: SegmentLayout,
        *,
        buckets: Mapping[int, int],
        grace_period: float = DEFAULT_GRACE_PERIOD,
        drained: Iterable[int] = (),
    ) -> None:
        super().__init__(layout, grace_period=grace_period, drained=drained, buckets=buckets)

    def owned(self, name: str) -> tuple[Unit, ...]:
        """The units ``name`` owns, in DAG order."""
        return self.assignment(name).units

    def to_status(self) -> dict[str, Any]:
        """As :meth:`Coordinator.to_status`, plus ``"type": "Queue"``."""
        return {**super().to_status(), "type": SubscriptionType.QUEUE.value}

    @classmethod
    def from_status(
        cls,
        data: Mapping[str, Any],
        layout: SegmentLayout,
        now: float,
        *,
        buckets: Mapping[int, int],
        grace_period: float = DEFAULT_GRACE_PERIOD,
    ) -> QueueCoordinator:
        """Restore :meth:`to_status` output: each segment's holders get contiguous slices of
        its buckets in name order (:func:`bucket_slices`), every consumer a fresh grace period
        from ``now``."""
        drained, consumers = cls._parse_status(data)
        coordinator = cls(layout, buckets=buckets, grace_period=grace_period, drained=drained)
        holders: dict[int, list[str]] = {}
        for name, segments in consumers:
            for segment_id in segments:
                holders.setdefault(segment_id, []).append(name)
        owner: dict[Unit, str] = {}
        for segment_id, names in holders.items():
            count = coordinator._buckets.get(segment_id)
            if count is None:
                continue
            for name, owned in bucket_slices(names, count).items():
                for bucket in owned:
                    owner[(segment_id, bucket)] = name
        coordinator._restore((name for name, _ in consumers), owner, now)
        return coordinator

    def _items(self, segment_id: int) -> list[Unit]:
        return [(segment_id, b) for b in range(self._buckets.get(segment_id, 0))]

    def _segment_of(self, item: Unit) -> int:
        return item[0]

    def _order(self, item: Unit) -> tuple[int, ...]:
        return item

    def _view_buckets(self, items: Sequence[Unit]) -> tuple[int, ...] | None:
        return tuple(b for _, b in items)

    def _affinity(self, item: Unit) -> set[str]:
        """The other holders of the unit's segment (fewer connections); for a segment nobody
        holds yet, the holders of its parents' units."""
        segment_id = item[0]
        same = {n for (s, _), n in self._owner.items() if s == segment_id}
        if same:
            return same
        parents = set(self._layout.segments[segment_id].parent_ids)
        return {n for (s, _), n in self._owner.items() if s in parents}

    def _move_cost(self, item: Unit, rank: int, recipient_segments: set[int]) -> tuple[int, ...]:
        """Units not read yet first, then a segment the recipient already reads (no new
        connection), then the newest segment's highest bucket (slices stay contiguous)."""
        segment_id, bucket = item
        return rank, 0 if segment_id in recipient_segments else 1, -segment_id, -bucket

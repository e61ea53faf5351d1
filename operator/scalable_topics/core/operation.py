"""The split/merge/rebucket protocol as data (DESIGN §5): the intent, its phases, and recovery.

The controller records an :class:`Operation` in ``status.operation`` before it touches a broker,
advances its ``phase`` after each step, and clears it in the same compare-and-swap that commits
the new layout. Everything a new leader needs to finish or undo the work is in the record: the
children are planned up front (ids, ranges, bucket counts) from the base layout, and applying
the operation to that base layout is deterministic, so a resumed operation produces exactly the
layout the first leader would have written.

Sealing a parent on its broker is the point of no return: once any parent has stopped taking
writes, the only safe direction is forward (the children must become writable). Before that,
an operation whose base epoch is no longer current is rolled back.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .layout import HashRange, SegmentLayout

__all__ = [
    "ChildPlan",
    "Operation",
    "OperationKind",
    "Phase",
    "Recovery",
    "plan_merge",
    "plan_split",
    "recovery",
]


class OperationKind(enum.StrEnum):
    SPLIT = "split"
    MERGE = "merge"
    REBUCKET = "rebucket"


class Phase(enum.StrEnum):
    """Progress of an operation; each value names the last step that is known complete."""

    INTENT = "Intent"
    CHILDREN_CREATED = "ChildrenCreated"
    PARENTS_SEALED = "ParentsSealed"

    @property
    def rank(self) -> int:
        return list(Phase).index(self)


class Recovery(enum.StrEnum):
    ROLL_FORWARD = "roll-forward"
    ROLL_BACK = "roll-back"


@dataclass(frozen=True)
class ChildPlan:
    segment_id: int
    hash_range: HashRange
    buckets: int
    parent_ids: tuple[int, ...]

    def to_status(self) -> dict[str, Any]:
        return {
            "id": self.segment_id,
            "range": self.hash_range.to_dict(),
            "buckets": self.buckets,
            "parents": list(self.parent_ids),
        }

    @classmethod
    def from_status(cls, data: Mapping[str, Any]) -> ChildPlan:
        return cls(
            segment_id=int(data["id"]),
            hash_range=HashRange(int(data["range"]["start"]), int(data["range"]["end"])),
            buckets=int(data["buckets"]),
            parent_ids=tuple(int(p) for p in data["parents"]),
        )


@dataclass(frozen=True)
class Operation:
    """One layout change in flight."""

    id: str
    kind: OperationKind
    parents: tuple[int, ...]
    children: tuple[ChildPlan, ...]
    base_epoch: int
    phase: Phase = Phase.INTENT
    at: int | None = None
    source: str = "manual"
    reason: str = ""
    request_id: str | None = None
    started_at: str = ""

    def advanced(self, phase: Phase) -> Operation:
        """The record after ``phase`` completed; phases never go backwards."""
        if phase.rank < self.phase.rank:
            raise ValueError(f"operation {self.id}: cannot go back from {self.phase} to {phase}")
        return replace(self, phase=phase)

    def apply(self, base: SegmentLayout) -> SegmentLayout:
        """The layout after this operation, checked against the planned children."""
        if base.epoch != self.base_epoch:
            raise ValueError(
                f"operation {self.id} was planned on epoch {self.base_epoch}, "
                f"layout is at epoch {base.epoch}"
            )
        if self.kind is OperationKind.SPLIT:
            result = base.split(self.parents[0], self.at)
        elif self.kind is OperationKind.MERGE:
            result = base.merge(*self.parents)
        else:
            result = _rebucket_layout(base, self.parents)
        for child in self.children:
            actual = result.segments.get(child.segment_id)
            if (
                actual is None
                or actual.hash_range != child.hash_range
                or actual.parent_ids != child.parent_ids
            ):
                raise ValueError(
                    f"operation {self.id}: planned child {child.segment_id} "
                    f"{child.hash_range.hex()} does not match the layout"
                )
        return result

    def to_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind.value,
            "parents": list(self.parents),
            "children": [c.to_status() for c in self.children],
            "baseEpoch": self.base_epoch,
            "phase": self.phase.value,
            "source": self.source,
            "reason": self.reason,
        }
        if self.started_at:
            status["startedAt"] = self.started_at
        if self.at is not None:
            status["at"] = self.at
        if self.request_id is not None:
            status["requestId"] = self.request_id
        return status

    @classmethod
    def from_status(cls, data: Mapping[str, Any]) -> Operation:
        try:
            return cls(
                id=str(data["id"]),
                kind=OperationKind(data["kind"]),
                parents=tuple(int(p) for p in data["parents"]),
                children=tuple(ChildPlan.from_status(c) for c in data["children"]),
                base_epoch=int(data["baseEpoch"]),
                phase=Phase(data.get("phase", Phase.INTENT.value)),
                at=None if data.get("at") is None else int(data["at"]),
                source=str(data.get("source", "manual")),
                reason=str(data.get("reason", "")),
                request_id=None if data.get("requestId") is None else str(data["requestId"]),
                started_at=str(data.get("startedAt", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed status.operation: {exc!r}") from None


def _rebucket_layout(base: SegmentLayout, segment_ids: Sequence[int]) -> SegmentLayout:
    from .buckets import rebucket

    return rebucket(base, list(segment_ids))


def _plan(
    operation_id: str,
    kind: OperationKind,
    base: SegmentLayout,
    parents: tuple[int, ...],
    target: SegmentLayout,
    buckets: Mapping[int, int],
    **fields: Any,
) -> Operation:
    children = tuple(
        ChildPlan(
            segment_id=sid,
            hash_range=target.segments[sid].hash_range,
            buckets=buckets[sid],
            parent_ids=target.segments[sid].parent_ids,
        )
        for sid in range(base.next_segment_id, target.next_segment_id)
    )
    return Operation(
        id=operation_id,
        kind=kind,
        parents=parents,
        children=children,
        base_epoch=base.epoch,
        **fields,
    )


def plan_split(
    operation_id: str,
    layout: SegmentLayout,
    segment_id: int,
    *,
    parent_buckets: int,
    at: int | None = None,
    **fields: Any,
) -> Operation:
    """Plan a split; raises ``ValueError`` (naming the segment) when it is not allowed."""
    from .buckets import split_child_buckets

    target = layout.split(segment_id, at)
    n = split_child_buckets(parent_buckets)
    ids = range(layout.next_segment_id, target.next_segment_id)
    return _plan(
        operation_id,
        OperationKind.SPLIT,
        layout,
        (segment_id,),
        target,
        dict.fromkeys(ids, n),
        at=at,
        **fields,
    )


def plan_merge(
    operation_id: str,
    layout: SegmentLayout,
    segment_ids: Sequence[int],
    *,
    parent_buckets: Mapping[int, int],
    **fields: Any,
) -> Operation:
    from .buckets import merge_child_buckets

    target = layout.merge(*segment_ids)
    n = merge_child_buckets(*(parent_buckets[i] for i in segment_ids))
    return _plan(
        operation_id,
        OperationKind.MERGE,
        layout,
        tuple(segment_ids),
        target,
        {layout.next_segment_id: n},
        **fields,
    )


def plan_rebucket(
    operation_id: str,
    layout: SegmentLayout,
    segment_ids: Sequence[int],
    *,
    buckets: int,
    **fields: Any,
) -> Operation:
    target = _rebucket_layout(layout, segment_ids)
    ids = range(layout.next_segment_id, target.next_segment_id)
    return _plan(
        operation_id,
        OperationKind.REBUCKET,
        layout,
        tuple(segment_ids),
        target,
        dict.fromkeys(ids, buckets),
        **fields,
    )


def recovery(operation: Operation, layout: SegmentLayout, *, any_parent_sealed: bool) -> Recovery:
    """What a new leader does with an operation it finds in status.

    ``any_parent_sealed`` is what the parents' brokers say now (the phase may lag behind a
    terminate that succeeded just before the old leader died).
    """
    if operation.phase is Phase.PARENTS_SEALED or any_parent_sealed:
        return Recovery.ROLL_FORWARD
    if layout.epoch != operation.base_epoch:
        return Recovery.ROLL_BACK
    try:
        operation.apply(layout)
    except ValueError:
        return Recovery.ROLL_BACK
    return Recovery.ROLL_FORWARD

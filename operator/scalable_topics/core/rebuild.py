"""Rebuilding a topic's segment DAG when ``status.layout`` is gone (docs/correctness.md, "Lost
status"), and the rule for which segments outside the DAG may be deleted.

``status.layout`` is the authoritative DAG, but not its only record. Every segment has a
``Segment`` resource (range, parents, bucket count, state and, once the leader recorded them, the
epochs of its creation and seal), and every segment's broker knows its range, bucket count,
whether it is fenced or sealed and, once sealed, its successors. A topic that comes back without
a status (a restore from backup, a migration with the same broker volumes, a re-created object)
is rebuilt from those records; it is never started afresh, because a fresh layout does not name
the other segments, and a segment not in the layout is one the leader deletes.

Pure: the controller gathers the records and this module decides.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .layout import HashRange, SegmentInfo, SegmentLayout, SegmentState
from .operation import ChildPlan, Operation, OperationKind
from .resources import (
    OperationSource,
    RequestResult,
    ResourceValidationError,
    SegmentPhase,
    parse_manual_request,
)
from .retention import drains_from_stats

__all__ = [
    "BrokerReport",
    "LayoutRebuildError",
    "Orphans",
    "Rebuilt",
    "SegmentRecord",
    "broker_report",
    "one_report_each",
    "orphans",
    "rebuild_layout",
    "record_from_segment",
    "request_after_rebuild",
    "subscription_entries",
    "unfinished_creation",
]


@dataclass(frozen=True)
class SegmentRecord:
    """What a ``Segment`` resource (or, without one, the segment's broker) says of a segment.

    ``state`` is the Segment's ``status.state``: ``Pending`` until the leader marked it, which it
    does only after the layout that holds it committed (so a Pending segment may be the child of
    an operation that never committed); for a broker's report, fenced is ``Pending``. Epochs are
    ``None`` where nothing recorded them.
    """

    segment_id: int
    hash_range: HashRange
    parent_ids: tuple[int, ...] = ()
    state: SegmentPhase = SegmentPhase.ACTIVE
    buckets: int = 1
    created_at_epoch: int | None = None
    sealed_at_epoch: int | None = None
    source: str = "Segment"
    parents_complete: bool = True
    """A Segment's spec names every parent it was created with (pruned ones too); a broker's
    report names only the parents still on a broker (their seals list it as a successor)."""
    recorded_at_epoch: int | None = None
    """The layout's epoch when a rebuild or a recovery last wrote the Segment: a rebuild raises
    the epoch without creating a segment, so only this keeps the next rebuild above it."""


@dataclass(frozen=True)
class BrokerReport:
    """One segment of the topic as a broker reports it (admin stats, docs/protocol.md)."""

    segment_id: int
    hash_range: HashRange
    buckets: int
    sealed: bool
    writable: bool
    successors: tuple[int, ...]
    sealed_at: float | None
    pod: str
    url: str
    subscriptions: frozenset[str] = frozenset()
    """The subscriptions the segment has (known for a sealed segment: from its stats)."""
    drained: frozenset[str] = frozenset()
    """Those that acknowledged everything up to the seal."""


class LayoutRebuildError(ValueError):
    """The records do not make one consistent DAG; ``problems`` names each inconsistency."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Rebuilt:
    """A rebuilt DAG: ``layout`` holds every committed segment; ``operation`` is the split, merge
    or rebucket that was in flight when the status went (its children are in the records but not
    in ``layout``), to be resumed like any operation found in ``status.operation``.
    ``from_brokers`` are the segments only a broker reported (their Segment resource is gone)."""

    layout: SegmentLayout
    operation: Operation | None
    buckets: Mapping[int, int]
    from_brokers: Mapping[int, BrokerReport]


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise ValueError(f"{what} is {value!r}, not an integer")
    return int(value)


def _epoch(value: Any, what: str) -> int | None:
    return None if value is None else _int(value, what)


def record_from_segment(body: Mapping[str, Any]) -> SegmentRecord:
    """The record of a ``Segment`` resource; ``ValueError`` names the resource and the field."""
    meta = body.get("metadata") or {}
    name = meta.get("name", "?")
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    try:
        sid = _int(spec.get("segmentId"), "spec.segmentId")
        rng = spec.get("range") or {}
        if not isinstance(rng, Mapping):
            raise ValueError(f"spec.range is {rng!r}, not an object")
        hash_range = HashRange(
            _int(rng.get("start"), "spec.range.start"), _int(rng.get("end"), "spec.range.end")
        )
        parents = tuple(_int(p, "spec.parents[]") for p in spec.get("parents") or ())
        state = SegmentPhase(status.get("state") or SegmentPhase.PENDING.value)
        return SegmentRecord(
            segment_id=sid,
            hash_range=hash_range,
            parent_ids=parents,
            state=state,
            buckets=_int(spec.get("buckets", 1), "spec.buckets"),
            created_at_epoch=_epoch(status.get("createdAtEpoch"), "status.createdAtEpoch"),
            sealed_at_epoch=_epoch(status.get("sealedAtEpoch"), "status.sealedAtEpoch"),
            recorded_at_epoch=_epoch(status.get("recordedAtEpoch"), "status.recordedAtEpoch"),
            source=f"Segment {name}",
        )
    except ValueError as exc:
        raise ValueError(f"Segment {name}: {exc}") from None


def broker_report(stats: Mapping[str, Any], pod: str, url: str) -> BrokerReport:
    """A broker's stats of one segment (its summary fields plus ``seal``) as a report."""
    try:
        rng = stats.get("range") or {}
        seal = stats.get("seal") if isinstance(stats.get("seal"), Mapping) else None
        successors: tuple[int, ...] = ()
        sealed_at: float | None = None
        if seal is not None:
            successors = tuple(
                _int((s or {}).get("segmentId"), "seal.successors[].segmentId")
                for s in seal.get("successors") or ()
            )
            at = seal.get("sealedAt")
            if isinstance(at, int | float) and not isinstance(at, bool) and at > 0:
                sealed_at = float(at)
        drains = drains_from_stats(stats)
        return BrokerReport(
            segment_id=_int(stats.get("segmentId"), "segmentId"),
            hash_range=HashRange(
                _int(rng.get("start"), "range.start"), _int(rng.get("end"), "range.end")
            ),
            buckets=_int(stats.get("buckets", 1), "buckets"),
            sealed=bool(stats.get("sealed")) or seal is not None,
            writable=stats.get("writable") is not False,
            successors=successors,
            sealed_at=sealed_at,
            pod=pod,
            url=url,
            subscriptions=drains.drained | drains.undrained,
            drained=drains.drained,
        )
    except (ValueError, AttributeError) as exc:
        raise ValueError(f"broker {pod}: segment {stats.get('segmentId')!r}: {exc}") from None


def one_report_each(
    reports: Iterable[BrokerReport], problems: list[str], known: Collection[int] = ()
) -> dict[int, BrokerReport]:
    """The brokers' report of each segment. A segment on two brokers is a problem (appended to
    ``problems``) unless its Segment resource (``known``) says where it lives."""
    by_id: dict[int, BrokerReport] = {}
    for report in reports:
        other = by_id.get(report.segment_id)
        if other is not None and other.pod != report.pod and report.segment_id not in known:
            problems.append(
                f"segment {report.segment_id} is on two brokers ({other.pod} and {report.pod}) "
                "and no Segment resource says which one owns it"
            )
            continue
        by_id[report.segment_id] = report
    return by_id


def _records_from_brokers(
    reports: Iterable[BrokerReport], problems: list[str], known: Collection[int]
) -> dict[int, tuple[SegmentRecord, BrokerReport]]:
    """A record per segment the brokers hold (:func:`one_report_each`): parents are the sealed
    segments that name it as a successor (a parent's seal lists its children), fenced is
    ``Pending``."""
    by_id = one_report_each(reports, problems, known)
    parents: dict[int, list[int]] = defaultdict(list)
    for report in sorted(by_id.values(), key=lambda r: r.hash_range.start):
        for child in report.successors:
            parents[child].append(report.segment_id)
    found: dict[int, tuple[SegmentRecord, BrokerReport]] = {}
    for sid, report in by_id.items():
        if report.sealed:
            state = SegmentPhase.SEALED
        elif not report.writable:
            state = SegmentPhase.PENDING
        else:
            state = SegmentPhase.ACTIVE
        record = SegmentRecord(
            segment_id=sid,
            hash_range=report.hash_range,
            parent_ids=tuple(parents.get(sid, ())),
            state=state,
            buckets=report.buckets,
            source=f"broker {report.pod}",
            parents_complete=False,
        )
        found[sid] = (record, report)
    return found


def _in_flight(records: Mapping[int, SegmentRecord]) -> list[int]:
    """The children of the operation that was in flight, if one was: the newest segments, still
    Pending, whose parents are all in the records and none marked Sealed.

    Operations run one at a time and ids only grow, so only the newest segments can belong to an
    operation that never committed; an older Pending segment is the child of one that committed
    before the leader could mark its Segments (the leader marks a parent Sealed, then its
    children Active, after the commit). Whether this one committed the records cannot tell;
    resuming it is right either way: it seals the parents on their brokers (idempotent) before
    the children take writes.
    """
    top = max(records)
    newest = records[top]
    parents = newest.parent_ids
    if (
        newest.state is not SegmentPhase.PENDING
        or not parents
        or any(p not in records or records[p].state is SegmentPhase.SEALED for p in parents)
    ):
        return []
    if len(parents) > 1:
        return [top]
    parent = records[parents[0]]
    sibling = records.get(top - 1)
    if (
        sibling is not None
        and sibling.state is SegmentPhase.PENDING
        and sibling.parent_ids == parents
    ):
        return [top - 1, top]
    if newest.hash_range != parent.hash_range:
        return []  # not a child of one operation: the checks of the DAG say what is wrong
    # A rebucket rollover seals several segments at once, each with a same-range successor.
    group = [top]
    sid = top - 1
    while sid in records:
        record = records[sid]
        only = record.parent_ids[0] if len(record.parent_ids) == 1 else None
        if (
            record.state is not SegmentPhase.PENDING
            or only is None
            or only not in records
            or records[only].state is SegmentPhase.SEALED
            or records[only].hash_range != record.hash_range
        ):
            break
        group.insert(0, sid)
        sid -= 1
    return group


def _operation(
    group: list[int],
    records: Mapping[int, SegmentRecord],
    layout: SegmentLayout,
    operation_id: str,
    started_at: str,
) -> Operation:
    children = tuple(
        ChildPlan(
            segment_id=sid,
            hash_range=records[sid].hash_range,
            buckets=records[sid].buckets,
            parent_ids=records[sid].parent_ids,
        )
        for sid in group
    )
    first = records[group[0]]
    at: int | None = None
    if len(first.parent_ids) > 1:
        kind, parents = OperationKind.MERGE, first.parent_ids
    elif len(group) == 2 and records[group[1]].parent_ids == first.parent_ids:
        kind, parents, at = OperationKind.SPLIT, first.parent_ids, first.hash_range.end
    else:
        kind = OperationKind.REBUCKET
        parents = tuple(records[sid].parent_ids[0] for sid in group)
    return Operation(
        id=operation_id,
        kind=kind,
        parents=parents,
        children=children,
        base_epoch=layout.epoch,
        at=at,
        source=OperationSource.REBUILT.value,
        reason="found interrupted in the Segment records when status.layout was rebuilt",
        started_at=started_at,
    )


def _epoch_bound(records: Mapping[int, SegmentRecord]) -> int:
    """An epoch above every epoch the topic's layout can have had.

    Each layout change is one epoch: an operation (it creates at least one segment, whose
    ``createdAtEpoch`` is its epoch) or the prune of one segment. Above the highest recorded
    epoch ``E`` lie at most one operation per segment without a recorded creation epoch and one
    per id that is not in the records (ids ``0 .. max`` were all handed out, so a missing one was
    pruned, or lost), plus one prune per missing id. An earlier rebuild (or a recovery of a
    Segment from its broker) recorded the epoch it had reached (``recorded_at_epoch``), so a
    second rebuild goes above the first. Clients and the consumer hub ignore a DAG whose epoch
    is lower than the one they hold, so the rebuilt epoch must not go back.
    """
    recorded = [
        e
        for r in records.values()
        for e in (r.created_at_epoch, r.sealed_at_epoch, r.recorded_at_epoch)
        if e is not None
    ]
    unrecorded = sum(1 for r in records.values() if r.created_at_epoch is None)
    missing = max(records) + 1 - len(records)
    return max(recorded, default=0) + unrecorded + 2 * missing + 1


def _check_links(records: Mapping[int, SegmentRecord], problems: list[str]) -> None:
    """Ids only grow, so every parent is older than its child; a split's, merge's or rebucket's
    children cover exactly their parents' ranges (checked where no parent was pruned)."""
    children: dict[int, list[int]] = defaultdict(list)
    for record in records.values():
        for parent in record.parent_ids:
            if parent >= record.segment_id:
                problems.append(
                    f"segment {record.segment_id} names parent {parent}, which is not older "
                    "(segment ids only grow)"
                )
            elif parent in records:
                children[parent].append(record.segment_id)
    for parent, kids in children.items():
        named = {frozenset(records[c].parent_ids) for c in kids}
        if len(named) > 1:
            problems.append(
                f"segment {parent} is the parent of {sorted(kids)}, which name different parents "
                f"({[list(records[c].parent_ids) for c in sorted(kids)]}): a segment is sealed "
                "by one split, merge or rebucket"
            )
    if problems:
        return
    checked: set[frozenset[int]] = set()
    for record in records.values():
        parents = record.parent_ids
        if not parents or frozenset(parents) in checked or any(p not in records for p in parents):
            continue
        checked.add(frozenset(parents))
        family = sorted({c for p in parents for c in children[p]})
        if not all(records[c].parent_ids == parents for c in family) or not all(
            records[c].parents_complete for c in family
        ):
            continue  # a rebucket of several segments, or parents a broker cannot name
        covered = _union([records[p].hash_range for p in parents])
        produced = _union([records[c].hash_range for c in family])
        if covered is None or produced is None or covered != produced:
            problems.append(
                f"segments {family} ({', '.join(records[c].hash_range.hex() for c in family)}) "
                f"do not cover exactly the range of their parents {list(parents)} "
                f"({', '.join(records[p].hash_range.hex() for p in parents)})"
            )


def _union(ranges: list[HashRange]) -> HashRange | None:
    """The contiguous union of ``ranges``, or ``None`` when they leave a gap or overlap."""
    ordered = sorted(ranges)
    for left, right in itertools.pairwise(ordered):
        if left.end + 1 != right.start:
            return None
    return HashRange(ordered[0].start, ordered[-1].end) if ordered else None


def rebuild_layout(
    segments: Iterable[SegmentRecord],
    brokers: Iterable[BrokerReport] = (),
    *,
    operation_id: str = "rebuilt",
    started_at: str = "",
) -> Rebuilt:
    """The DAG the records describe, with an epoch above any the topic had.

    Segment resources come first; a broker's report stands in for a Segment that is gone.
    Children are derived from parents; a parent not in the records was pruned, and the link to
    it is dropped (as the prune dropped it). A segment is sealed in the DAG exactly when a
    committed segment names it as a parent. ``nextSegmentId`` is one above the highest committed
    id. Raises :class:`LayoutRebuildError`, naming each inconsistency, when the records do not
    make one DAG whose active segments partition the ring.
    """
    problems: list[str] = []
    records: dict[int, SegmentRecord] = {}
    for record in segments:
        if record.segment_id in records:
            problems.append(f"segment {record.segment_id} has two Segment resources")
        records[record.segment_id] = record
    from_brokers: dict[int, BrokerReport] = {}
    for sid, (record, report) in _records_from_brokers(brokers, problems, records).items():
        known = records.get(sid)
        if known is None:
            records[sid] = record
            from_brokers[sid] = report
        elif known.hash_range != record.hash_range:
            problems.append(
                f"segment {sid}: {known.source} says range {known.hash_range.hex()}, "
                f"{record.source} holds {record.hash_range.hex()}"
            )
    if not records:
        raise LayoutRebuildError(["no Segment resource and no broker holds a segment of it"])
    _check_links(records, problems)
    if problems:
        raise LayoutRebuildError(problems)
    group = _in_flight(records)
    committed = {sid: r for sid, r in records.items() if sid not in group}
    if not committed:
        raise LayoutRebuildError([*problems, "every segment is the child of an operation"])
    children: dict[int, list[int]] = defaultdict(list)
    for record in committed.values():
        for parent in record.parent_ids:
            if parent in committed:
                children[parent].append(record.segment_id)
    created: dict[int, int] = {}
    infos: dict[int, SegmentInfo] = {}
    for sid in sorted(committed):
        record = committed[sid]
        parents = tuple(p for p in record.parent_ids if p in committed)
        kids = tuple(sorted(children[sid]))
        if record.state is SegmentPhase.SEALED and not kids:
            problems.append(
                f"segment {sid} ({record.hash_range.hex()}) is sealed ({record.source}) but no "
                "segment names it as a parent: its successors are missing"
            )
        if record.created_at_epoch is not None:
            created[sid] = record.created_at_epoch
        else:
            created[sid] = max(
                (committed[p].sealed_at_epoch or created[p] + 1 for p in parents),
                default=0,
            )
        infos[sid] = SegmentInfo(
            segment_id=sid,
            hash_range=record.hash_range,
            state=SegmentState.SEALED if kids else SegmentState.ACTIVE,
            parent_ids=parents,
            child_ids=kids,
            created_at_epoch=created[sid],
        )
    for sid, info in infos.items():
        if info.child_ids:
            recorded = committed[sid].sealed_at_epoch
            sealed_at = recorded or min(created[c] for c in info.child_ids)
            infos[sid] = replace(info, sealed_at_epoch=max(1, sealed_at))
    layout = SegmentLayout(_epoch_bound(records), max(committed) + 1, infos)
    try:
        layout.validate()
    except ValueError as exc:
        problems.append(str(exc))
    operation = None
    if group and not problems:  # the operation is checked against a valid layout only
        operation = _operation(group, records, layout, operation_id, started_at)
        try:
            operation.apply(layout)
        except ValueError as exc:
            problems.append(f"the interrupted operation on segments {group} does not apply: {exc}")
    if problems:
        raise LayoutRebuildError(problems)
    buckets = {sid: r.buckets for sid, r in records.items()}
    return Rebuilt(layout, operation, buckets, from_brokers)


def unfinished_creation(
    records: Collection[SegmentRecord], reports: Iterable[BrokerReport], first: SegmentLayout
) -> bool:
    """Whether what exists of a topic without a layout is the start of its creation, as a
    pass that died before its Ready write leaves it (a new topic's first layout is recorded
    with Ready, after its Segments are created): Segment records only, each a segment of the
    ``first`` layout (its id and range, no parents, not sealed, no other epoch, no epoch a
    rebuild recorded: the topic's epoch never goes back), and brokers holding nothing but
    those, unsealed. Such a topic is created to the end (the first layout,
    the placements on record), not rebuilt; anything else is rebuilt.

    The caller checks what records cannot say: that every Segment belongs to this uid of the
    topic (a re-created topic's Segments are taken over by a rebuild)."""
    if not records:
        return False
    ranges = {r.segment_id: r.hash_range for r in records}
    for record in records:
        info = first.segments.get(record.segment_id)
        if (
            info is None
            or record.hash_range != info.hash_range
            or record.parent_ids
            or record.state is SegmentPhase.SEALED
            or record.created_at_epoch not in (None, first.epoch)
            or record.sealed_at_epoch is not None
            or record.recorded_at_epoch is not None
        ):
            return False
    return all(
        ranges.get(report.segment_id) == report.hash_range
        and not report.sealed
        and not report.successors
        for report in reports
    )


@dataclass(frozen=True)
class Orphans:
    """Segments (Segment resources) that are not in the layout: ``remove`` may be deleted, on
    their broker and as resources; ``keep`` must not be."""

    remove: tuple[int, ...]
    keep: tuple[int, ...]


def orphans(
    layout: SegmentLayout, segment_ids: Iterable[int], in_flight: Collection[int]
) -> Orphans:
    """The deletion rule: a segment outside the DAG is deleted only when the authoritative
    layout handed its id out (``id < nextSegmentId``) and no longer has it — it was pruned by
    retention. The children of an operation in flight (``in_flight``) are not in the layout yet
    and stay; so does any id at or above ``nextSegmentId``: the layout never had it, which is
    what a missing, fresh or rebuilt layout looks like next to segments it does not know about
    (their data is kept, not deleted). The children of a rolled-back operation are deleted by the
    roll-back itself, before it clears ``status.operation``.
    """
    remove: list[int] = []
    keep: list[int] = []
    for sid in sorted(set(segment_ids)):
        if sid in layout.segments or sid in in_flight:
            continue
        (remove if sid < layout.next_segment_id else keep).append(sid)
    return Orphans(tuple(remove), tuple(keep))


def subscription_entries(
    layout: SegmentLayout, reports: Iterable[BrokerReport], subscriptions: Mapping[str, str]
) -> list[dict[str, Any]]:
    """``status.subscriptions`` for a rebuilt layout (``subscriptions``: name → ``Stream`` or
    ``Queue``), as the consumer hub persists them: no consumers (they register again), and
    drained, per subscription, only the sealed segments that every broker copy says it consumed
    to the end, or never had (a subscription added after the seal), or that no broker holds any
    more. A sealed segment with backlog stays undrained, so its children wait for it: a new
    leader would otherwise take a subscription without an entry for a new one and count every
    sealed segment drained, skipping their backlog."""
    copies: dict[int, list[BrokerReport]] = defaultdict(list)
    for report in reports:
        copies[report.segment_id].append(report)
    entries = []
    for name, kind in sorted(subscriptions.items()):
        drained = sorted(
            sid
            for sid, info in layout.segments.items()
            if not info.active
            and all(name in r.drained or name not in r.subscriptions for r in copies[sid])
        )
        entries.append(
            {
                "name": name,
                "type": kind,
                "layoutEpoch": layout.epoch,
                "consumers": [],
                "drainedSegments": drained,
            }
        )
    return entries


def request_after_rebuild(
    annotation: str | None, operation: Operation | None, now: str
) -> tuple[Operation | None, dict[str, Any] | None]:
    """The manual request annotation of a topic whose status was rebuilt: whether it ran is
    unknown (the status that recorded it is gone), and a request runs at most once. A request
    that names the interrupted ``operation`` (same kind, parents and split point) is that
    operation, reported when it commits; any other is returned as a ``lastRequest`` saying it is
    not run again (apply it with a new id if it is still wanted). Returns the operation (with
    the request's id when it is that request) and the ``lastRequest`` to record, if any."""
    if not annotation:
        return operation, None
    try:
        request = parse_manual_request(annotation)
    except ResourceValidationError:
        return operation, None  # never runs: the reconciler rejects it as for any topic
    if operation is not None and operation.request_id == request.id:
        return operation, None
    if (
        operation is not None
        and operation.request_id is None
        and request.op.value == operation.kind.value
        and tuple(request.segments) == operation.parents
        and request.at in (None, operation.at)
    ):
        return replace(operation, request_id=request.id), None
    return operation, {
        "id": request.id,
        "op": request.op.value,
        "result": RequestResult.REJECTED.value,
        "message": "not run again: status.layout was lost and rebuilt, and whether this request "
        "ran before is unknown; apply it with a new id if it is still wanted",
        "completedAt": now,
    }

"""The correctness checker: a pure analysis of a recorded history, after Jepsen's queue checkers.

The workload gives every message a unique ``(key, value)``: per key, the writer sends the values
``0, 1, 2, …`` in that order. A :class:`History` holds

- every send with its outcome — ``ok`` (acknowledged, with the segment and position of the
  acknowledgement), ``fail`` (certainly not written) or ``info`` (unknown: timed out or the
  connection broke, it may or may not have been written);
- every delivery to a consumer, in the order they happened: subscription, consumer name, the
  consumer's *session* (one per open; a restart under the same name is a new session), key,
  value, segment, position and time;
- the restarts the nemesis caused (consumer, broker, operator), with the start and end of
  their outage (and, for a broker, the segments it hosted).

:func:`check` classifies, per subscription (every subscription must receive every acknowledged
write):

``lost``
    acknowledged and never delivered (the history is taken after the final drain).
``duplicates``
    a value delivered again. A redelivery is *after a restart* when the outage of a restart
    that can cause it overlaps the time between the earlier delivery and this one — a restart
    of the consumer that had the earlier delivery (its unacknowledged work goes to whoever gets
    the segment next) or of the broker hosting the segment (cursors are flushed periodically,
    so a crash can roll a cursor back a little: at-least-once). Anything else is
    ``duplicates_unexplained``. A value stored twice — delivered at two different
    ``(segment, position)`` — is a *double write* and never explained.

    A *checkpoint* session (one with a :class:`CheckpointStart`: a checkpoint consumer keeps
    its own positions, the broker keeps none for it) is judged by its checkpoint instead: it
    resumes every segment and entry bucket it is given from the checkpoint it started from, so
    a redelivery to it is explained (*checkpoint-restore*) exactly when that checkpoint does not
    cover the message (by segment position, or by ``(segment, bucket)`` position, the bucket
    computed from ``History.buckets``) and the session had not delivered the value itself
    before. A checkpoint session that re-reads what its checkpoint covers, or what it already
    delivered, is an unexplained duplicate whatever restarted.
``reordered``
    on an ordered (Stream) subscription, the first delivery of a value after the first delivery
    of a larger value of the same key, whether both went to one session or the larger one went
    to another consumer before a split/merge hand-off (a child's consumer must not get anything
    of a key before the parent's consumer got all of it). Redeliveries are duplicates, not
    reorderings.
``skips``
    on an ordered subscription, a consumer session read ``a`` then ``b > a`` of a key while an
    acknowledged value between them was never delivered to that subscription at all (a hole in
    the middle of what it read, not a lost tail). A value in the gap that another session read
    is a hand-off (the key's segment moved between consumers) and only counted as
    ``skips_handed_off``.
``unexpected``
    a delivered value that was never sent.
``recovered`` / ``unknown_unread``
    ``info`` sends that were / were not delivered (both are allowed).
``failed_but_read``
    a ``fail`` send that was delivered (the client claimed a definite failure; like Jepsen's
    aborted read).
``inconsistent_positions``
    a delivery at a ``(segment, position)`` other than the one the acknowledgement reported.
``write_reorders``
    two acknowledged values of a key in the same segment whose positions are in the opposite
    order of their values (the log itself holds the key out of order).

:func:`handoff_windows` measures the producer-blocked window of a split or merge per key from
the sends, :func:`segment_gap` the same hand-off for the whole segment.
"""

from __future__ import annotations

import bisect
import enum
import json
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scalable_topics.core.buckets import bucket_of
from scalable_topics.core.hashing import bucket_hash

__all__ = [
    "CheckReport",
    "CheckpointStart",
    "Delivery",
    "Example",
    "History",
    "KeyWindow",
    "Outcome",
    "Restart",
    "RestartKind",
    "Send",
    "SubscriptionReport",
    "Summary",
    "check",
    "handoff_windows",
    "segment_gap",
    "summarize",
]

EXAMPLES_PER_KIND = 10


class Outcome(enum.StrEnum):
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


class RestartKind(enum.StrEnum):
    CONSUMER = "consumer"
    BROKER = "broker"
    OPERATOR = "operator"


@dataclass(frozen=True, slots=True)
class Send:
    """One send: invoked at ``invoked``, completed at ``completed`` with ``outcome``."""

    key: str
    value: int
    invoked: float
    outcome: Outcome
    completed: float | None = None
    segment: int | None = None
    position: int | None = None


@dataclass(frozen=True, slots=True)
class Delivery:
    subscription: str
    consumer: str
    session: int
    key: str
    value: int
    time: float
    segment: int | None = None
    position: int | None = None
    batch: int = 0
    """The message's index in its entry."""


@dataclass(frozen=True, slots=True)
class CheckpointStart:
    """A checkpoint consumer session started from ``checkpoint`` (the JSON form of
    :class:`scalable_topics.client.Checkpoint`: ``positions``, ``bucketPositions``,
    ``drained``)."""

    subscription: str
    consumer: str
    session: int
    checkpoint: dict[str, Any]

    def covers(self, segment: int, position: int, batch: int, bucket: int | None) -> bool:
        """As ``Checkpoint.covers``: processed before the checkpoint was taken."""
        if segment in (self.checkpoint.get("drained") or ()):
            return True
        at = (position, batch)
        whole = (self.checkpoint.get("positions") or {}).get(str(segment))
        if whole is not None and at <= (whole["position"], whole.get("batchIndex", 0)):
            return True
        if bucket is None:
            return False
        unit = (self.checkpoint.get("bucketPositions") or {}).get(f"{segment}/{bucket}")
        return unit is not None and at <= (unit["position"], unit.get("batchIndex", 0))


@dataclass(frozen=True, slots=True)
class Restart:
    """A fault that may legitimately cause redeliveries: it began at ``time`` (the kill, the
    close) and was over at ``until`` (the process is back, the consumer re-opened; ``None``:
    at ``time``).

    ``target`` is the consumer name for a consumer restart (with its ``subscription``), the pod
    for a broker or operator restart. ``segments``, for a broker, are the segments it hosted:
    only their redeliveries are excused (empty: any segment's).
    """

    time: float
    kind: RestartKind
    target: str
    subscription: str | None = None
    until: float | None = None
    segments: tuple[int, ...] = ()

    @property
    def end(self) -> float:
        return self.time if self.until is None else max(self.time, self.until)


@dataclass
class History:
    """A run's record. ``ordered`` maps every subscription to whether it promises per-key order
    (Stream: yes; Queue: no). Deliveries are analysed in time order (stable for equal times, so
    one recorder's order is kept)."""

    ordered: dict[str, bool]
    sends: list[Send] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    checkpoints: list[CheckpointStart] = field(default_factory=list)
    buckets: dict[int, int] = field(default_factory=dict)
    """Segment -> entry-bucket count (to place a key in a checkpoint's bucket positions)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "ordered": self.ordered,
            "sends": [asdict(s) for s in self.sends],
            "deliveries": [asdict(d) for d in self.deliveries],
            "restarts": [asdict(r) for r in self.restarts],
            "checkpoints": [asdict(c) for c in self.checkpoints],
            "buckets": {str(k): v for k, v in self.buckets.items()},
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> History:
        return cls(
            ordered={str(k): bool(v) for k, v in body["ordered"].items()},
            sends=[Send(**{**s, "outcome": Outcome(s["outcome"])}) for s in body.get("sends", [])],
            deliveries=[Delivery(**d) for d in body.get("deliveries", [])],
            restarts=[
                Restart(
                    **{
                        **r,
                        "kind": RestartKind(r["kind"]),
                        "segments": tuple(r.get("segments") or ()),
                    }
                )
                for r in body.get("restarts", [])
            ],
            checkpoints=[CheckpointStart(**c) for c in body.get("checkpoints", [])],
            buckets={int(k): int(v) for k, v in (body.get("buckets") or {}).items()},
        )

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json()), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> History:
        return cls.from_json(json.loads(path.read_text(encoding="utf-8")))


@dataclass(frozen=True, slots=True)
class Example:
    kind: str
    key: str
    value: int
    subscription: str | None
    detail: str

    def __str__(self) -> str:
        where = f"[{self.subscription}] " if self.subscription else ""
        return f"{where}{self.kind} {self.key}={self.value}: {self.detail}"


@dataclass
class SubscriptionReport:
    name: str
    ordered: bool
    deliveries: int = 0
    distinct: int = 0
    lost: int = 0
    duplicates_after_restart: int = 0
    duplicates_unexplained: int = 0
    duplicates_by_cause: dict[str, int] = field(default_factory=dict)
    double_writes: int = 0
    reordered: int = 0
    reordered_across_sessions: int = 0
    skips: int = 0
    skips_handed_off: int = 0
    sessions: int = 0


@dataclass
class CheckReport:
    sends: dict[str, int]
    subscriptions: dict[str, SubscriptionReport]
    unexpected: int = 0
    recovered: int = 0
    unknown_unread: int = 0
    failed_but_read: int = 0
    inconsistent_positions: int = 0
    write_reorders: int = 0
    examples: dict[str, list[Example]] = field(default_factory=dict)

    def _total(self, attribute: str) -> int:
        return sum(int(getattr(s, attribute)) for s in self.subscriptions.values())

    @property
    def lost(self) -> int:
        return self._total("lost")

    @property
    def duplicates_after_restart(self) -> int:
        return self._total("duplicates_after_restart")

    @property
    def duplicates_unexplained(self) -> int:
        return self._total("duplicates_unexplained")

    @property
    def double_writes(self) -> int:
        return self._total("double_writes")

    @property
    def reordered(self) -> int:
        return self._total("reordered") + self.write_reorders

    @property
    def skips(self) -> int:
        return self._total("skips")

    @property
    def valid(self) -> bool:
        """The required result: nothing lost, reordered, skipped, unexpected or inconsistent,
        and every duplicate explained by a restart."""
        return not (
            self.lost
            or self.reordered
            or self.skips
            or self.unexpected
            or self.duplicates_unexplained
            or self.failed_but_read
            or self.inconsistent_positions
        )

    def add_example(self, example: Example) -> None:
        bucket = self.examples.setdefault(example.kind, [])
        if len(bucket) < EXAMPLES_PER_KIND:
            bucket.append(example)

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "sends": self.sends,
            "lost": self.lost,
            "duplicatesAfterRestart": self.duplicates_after_restart,
            "duplicatesUnexplained": self.duplicates_unexplained,
            "doubleWrites": self.double_writes,
            "reordered": self.reordered,
            "writeReorders": self.write_reorders,
            "skips": self.skips,
            "unexpected": self.unexpected,
            "recovered": self.recovered,
            "unknownUnread": self.unknown_unread,
            "failedButRead": self.failed_but_read,
            "inconsistentPositions": self.inconsistent_positions,
            "subscriptions": {k: asdict(v) for k, v in self.subscriptions.items()},
            "examples": {k: [str(e) for e in v] for k, v in self.examples.items()},
        }

    def summary(self) -> str:
        lines = [
            f"valid={self.valid} sends={self.sends} lost={self.lost} "
            f"reordered={self.reordered} (write {self.write_reorders}) skips={self.skips} "
            f"unexpected={self.unexpected} duplicates: after-restart="
            f"{self.duplicates_after_restart} unexplained={self.duplicates_unexplained} "
            f"(double writes {self.double_writes}) recovered={self.recovered} "
            f"unknown-unread={self.unknown_unread} failed-but-read={self.failed_but_read} "
            f"inconsistent-positions={self.inconsistent_positions}"
        ]
        for sub in self.subscriptions.values():
            lines.append(
                f"  {sub.name} ({'ordered' if sub.ordered else 'unordered'}): "
                f"{sub.deliveries} deliveries, {sub.distinct} distinct, {sub.sessions} sessions, "
                f"lost {sub.lost}, dup after restart {sub.duplicates_after_restart} "
                f"{sub.duplicates_by_cause}, dup unexplained {sub.duplicates_unexplained}, "
                f"reordered {sub.reordered} (across sessions {sub.reordered_across_sessions}), "
                f"skips {sub.skips} (handed off {sub.skips_handed_off})"
            )
        for kind, examples in sorted(self.examples.items()):
            lines.append(f"  e.g. {kind}:")
            lines.extend(f"    {e}" for e in examples)
        return "\n".join(lines)


Value = tuple[str, int]
Place = tuple[int, int]
Session = tuple[str, int]


def _index_sends(sends: Iterable[Send]) -> dict[Value, Send]:
    by_value: dict[Value, Send] = {}
    for send in sends:
        kv = (send.key, send.value)
        if kv in by_value:
            raise ValueError(f"the history sends {send.key}={send.value} twice; values are unique")
        by_value[kv] = send
    return by_value


def _place(segment: int | None, position: int | None) -> Place | None:
    if segment is None or position is None or position < 0:
        return None
    return (segment, position)


def check(
    history: History,
    *,
    excusing: Collection[RestartKind] = (RestartKind.CONSUMER, RestartKind.BROKER),
) -> CheckReport:
    """Analyse ``history`` (see the module docstring). ``excusing`` are the restart kinds that
    may explain a redelivery; a consumer restart explains only redeliveries of what that
    consumer had received."""
    sends = _index_sends(history.sends)
    counts = {o.value: 0 for o in Outcome}
    for send in history.sends:
        counts[send.outcome.value] += 1
    report = CheckReport(
        sends=counts,
        subscriptions={
            name: SubscriptionReport(name, ordered) for name, ordered in history.ordered.items()
        },
    )
    acked_by_key: dict[str, list[int]] = defaultdict(list)
    for kv, send in sends.items():
        if send.outcome is Outcome.OK:
            acked_by_key[kv[0]].append(kv[1])
    for values in acked_by_key.values():
        values.sort()

    deliveries = sorted(history.deliveries, key=lambda d: d.time)
    by_subscription: dict[str, list[Delivery]] = defaultdict(list)
    for delivery in deliveries:
        if delivery.subscription not in report.subscriptions:
            raise ValueError(
                f"delivery on subscription {delivery.subscription!r} missing from 'ordered'"
            )
        by_subscription[delivery.subscription].append(delivery)

    _check_values(report, sends, deliveries)
    _check_write_order(report, sends)
    restarts = sorted((r for r in history.restarts if r.kind in excusing), key=lambda r: r.time)
    starts = {(c.subscription, c.consumer, c.session): c for c in history.checkpoints}
    for name, sub in report.subscriptions.items():
        subs = by_subscription.get(name, [])
        restored = _Restores(
            {(c, s): start for (n, c, s), start in starts.items() if n == name}, history.buckets
        )
        _check_subscription(report, sub, subs, sends, restarts, restored)
        if sub.ordered:
            _check_skips(report, sub, subs, acked_by_key)
    return report


def _check_values(
    report: CheckReport, sends: Mapping[Value, Send], deliveries: Sequence[Delivery]
) -> None:
    read: set[Value] = set()
    for d in deliveries:
        kv = (d.key, d.value)
        send = sends.get(kv)
        if send is None:
            report.unexpected += 1
            report.add_example(
                Example("unexpected", d.key, d.value, d.subscription, f"read by {d.consumer}")
            )
            continue
        if send.outcome is Outcome.OK:
            acked_at, read_at = _place(send.segment, send.position), _place(d.segment, d.position)
            if acked_at and read_at and acked_at != read_at:
                report.inconsistent_positions += 1
                report.add_example(
                    Example(
                        "inconsistent-position",
                        d.key,
                        d.value,
                        d.subscription,
                        f"acknowledged at {acked_at}, read at {read_at} by {d.consumer}",
                    )
                )
        read.add(kv)
    for kv, send in sends.items():
        if send.outcome is Outcome.INFO:
            if kv in read:
                report.recovered += 1
            else:
                report.unknown_unread += 1
        elif send.outcome is Outcome.FAIL and kv in read:
            report.failed_but_read += 1
            report.add_example(
                Example("failed-but-read", kv[0], kv[1], None, "the send failed definitely")
            )


def _check_write_order(report: CheckReport, sends: Mapping[Value, Send]) -> None:
    placed: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for (key, value), send in sends.items():
        at = _place(send.segment, send.position)
        if send.outcome is Outcome.OK and at is not None:
            placed[(key, at[0])].append((value, at[1]))
    for (key, segment), items in placed.items():
        items.sort()
        highest = -1
        for value, position in items:
            if position < highest:
                report.write_reorders += 1
                report.add_example(
                    Example(
                        "write-reorder",
                        key,
                        value,
                        None,
                        f"stored at position {position} of segment {segment}, after a smaller "
                        f"value at {highest}",
                    )
                )
            highest = max(highest, position)


def _excused_by(
    restarts: Sequence[Restart], subscription: str, earlier: Delivery, later: Delivery
) -> RestartKind | None:
    """A restart whose outage overlaps ``[earlier, later]``: the earlier delivery happened
    before the restart was over (so its acknowledgement may not have been kept — entries
    already on the wire when a broker is killed still reach the consumer) and the redelivery
    after the restart began."""
    for restart in restarts:
        if restart.time > later.time:
            break
        if restart.end < earlier.time:
            continue
        if restart.kind is RestartKind.CONSUMER:
            if restart.target == earlier.consumer and restart.subscription in (None, subscription):
                return restart.kind
        elif not restart.segments or earlier.segment in restart.segments:
            return restart.kind
    return None


CHECKPOINT_RESTORE = "checkpoint-restore"


@dataclass
class _Restores:
    """The checkpoint sessions of one subscription and what each already delivered."""

    starts: dict[Session, CheckpointStart]
    buckets: Mapping[int, int]
    seen: set[tuple[Session, Value]] = field(default_factory=set)

    def judge(self, d: Delivery) -> str | None:
        """For a redelivery ``d`` to a checkpoint session: ``None`` when its checkpoint
        explains it, else why not. Call for every delivery (it records what was seen)."""
        session = (d.consumer, d.session)
        start = self.starts[session]
        kv = (d.key, d.value)
        if (session, kv) in self.seen:
            return f"{d.consumer}#{d.session} had delivered it already"
        self.seen.add((session, kv))
        if d.segment is None or d.position is None:
            return "no position to compare with its checkpoint"
        n = self.buckets.get(d.segment, 1)
        bucket = bucket_of(bucket_hash(d.key), n) if n > 1 else None
        if start.covers(d.segment, d.position, d.batch, bucket):
            return (
                f"{d.consumer}#{d.session} started from a checkpoint covering segment "
                f"{d.segment} position {d.position}/{d.batch} (bucket {bucket})"
            )
        return None


def _check_subscription(
    report: CheckReport,
    sub: SubscriptionReport,
    deliveries: Sequence[Delivery],
    sends: Mapping[Value, Send],
    restarts: Sequence[Restart],
    restored: _Restores | None = None,
) -> None:
    last_delivery: dict[Value, Delivery] = {}
    places: dict[Value, Place] = {}
    highest_first: dict[str, Delivery] = {}
    sessions: set[Session] = set()
    for d in deliveries:
        kv = (d.key, d.value)
        sessions.add((d.consumer, d.session))
        sub.deliveries += 1
        checkpointed = restored is not None and (d.consumer, d.session) in restored.starts
        why_not = restored.judge(d) if restored is not None and checkpointed else None
        at = _place(d.segment, d.position)
        earlier = last_delivery.get(kv)
        last_delivery[kv] = d
        if earlier is not None:
            first_at = places.get(kv)
            if at is not None and first_at is not None and at != first_at:
                sub.double_writes += 1
                sub.duplicates_unexplained += 1
                report.add_example(
                    Example(
                        "double-write",
                        d.key,
                        d.value,
                        sub.name,
                        f"delivered at {first_at} and at {at}",
                    )
                )
                continue
            if checkpointed:
                if why_not is None:
                    sub.duplicates_after_restart += 1
                    sub.duplicates_by_cause[CHECKPOINT_RESTORE] = (
                        sub.duplicates_by_cause.get(CHECKPOINT_RESTORE, 0) + 1
                    )
                else:
                    sub.duplicates_unexplained += 1
                    report.add_example(
                        Example(
                            "duplicate",
                            d.key,
                            d.value,
                            sub.name,
                            f"to {earlier.consumer}#{earlier.session} at {earlier.time:.3f} and "
                            f"to {d.consumer}#{d.session} at {d.time:.3f}: {why_not}",
                        )
                    )
                continue
            cause = _excused_by(restarts, sub.name, earlier, d)
            if cause is None:
                sub.duplicates_unexplained += 1
                report.add_example(
                    Example(
                        "duplicate",
                        d.key,
                        d.value,
                        sub.name,
                        f"to {earlier.consumer}#{earlier.session} at {earlier.time:.3f} and to "
                        f"{d.consumer}#{d.session} at {d.time:.3f}, no restart in between",
                    )
                )
            else:
                sub.duplicates_after_restart += 1
                sub.duplicates_by_cause[cause.value] = (
                    sub.duplicates_by_cause.get(cause.value, 0) + 1
                )
            continue
        sub.distinct += 1
        if at is not None:
            places[kv] = at
        if kv not in sends:
            continue
        if sub.ordered:
            top = highest_first.get(d.key)
            if top is not None and d.value < top.value:
                sub.reordered += 1
                across = (top.consumer, top.session) != (d.consumer, d.session)
                sub.reordered_across_sessions += across
                report.add_example(
                    Example(
                        "reordered",
                        d.key,
                        d.value,
                        sub.name,
                        f"first delivered to {d.consumer}#{d.session} at {d.time:.3f} (segment "
                        f"{d.segment}) after {top.value} went to {top.consumer}#{top.session} at "
                        f"{top.time:.3f} (segment {top.segment})",
                    )
                )
            if top is None or d.value > top.value:
                highest_first[d.key] = d
    sub.sessions = len(sessions)
    for kv, send in sends.items():
        if send.outcome is Outcome.OK and kv not in last_delivery:
            sub.lost += 1
            report.add_example(
                Example(
                    "lost",
                    kv[0],
                    kv[1],
                    sub.name,
                    f"acknowledged at segment {send.segment} position {send.position}",
                )
            )


def _check_skips(
    report: CheckReport,
    sub: SubscriptionReport,
    deliveries: Sequence[Delivery],
    acked_by_key: Mapping[str, list[int]],
) -> None:
    by_session: dict[Session, set[Value]] = defaultdict(set)
    readers: dict[Value, set[Session]] = defaultdict(set)
    for d in deliveries:
        session = (d.consumer, d.session)
        by_session[session].add((d.key, d.value))
        readers[(d.key, d.value)].add(session)
    previous: dict[tuple[Session, str], int] = {}
    for d in deliveries:
        session = (d.consumer, d.session)
        slot = (session, d.key)
        before = previous.get(slot)
        previous[slot] = d.value if before is None else max(before, d.value)
        if before is None or d.value <= before + 1:
            continue
        acked = acked_by_key.get(d.key, [])
        lo = bisect.bisect_right(acked, before)
        hi = bisect.bisect_left(acked, d.value)
        for missing in acked[lo:hi]:
            kv = (d.key, missing)
            if kv in by_session[session]:
                continue
            if readers.get(kv):
                sub.skips_handed_off += 1
                continue
            sub.skips += 1
            report.add_example(
                Example(
                    "skip",
                    d.key,
                    missing,
                    sub.name,
                    f"{d.consumer}#{d.session} read {before} then {d.value}; {missing} was "
                    "acknowledged and never delivered",
                )
            )


# -- hand-off windows ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyWindow:
    """How one key crossed from a sealed parent to a child.

    ``gap`` is the literal time between the key's last acknowledgement on a parent and its
    first on a child; under an open-loop schedule it includes the key's own send interval.
    ``blocked`` counts only the time the producer held the key back: from the later of the last
    parent acknowledgement and the first child send's invocation to that send's
    acknowledgement — the producer-blocked window.
    """

    key: str
    parent: int
    child: int
    last_parent_ack: float
    first_child_invoked: float
    first_child_ack: float

    @property
    def gap(self) -> float:
        return self.first_child_ack - self.last_parent_ack

    @property
    def blocked(self) -> float:
        return self.first_child_ack - max(self.last_parent_ack, self.first_child_invoked)


def handoff_windows(
    sends: Iterable[Send], parents: Collection[int], children: Collection[int]
) -> list[KeyWindow]:
    """Per key acknowledged on a parent and then on a child of one split/merge/rollover."""
    last_parent: dict[str, Send] = {}
    first_child: dict[str, Send] = {}
    for send in sends:
        if send.outcome is not Outcome.OK or send.completed is None:
            continue
        if send.segment in parents:
            held = last_parent.get(send.key)
            if held is None or send.value > held.value:
                last_parent[send.key] = send
        elif send.segment in children:
            held = first_child.get(send.key)
            if held is None or send.value < held.value:
                first_child[send.key] = send
    windows = []
    for key, parent in sorted(last_parent.items()):
        child = first_child.get(key)
        if child is None or child.value < parent.value:
            continue
        assert parent.completed is not None and child.completed is not None
        assert parent.segment is not None and child.segment is not None
        windows.append(
            KeyWindow(
                key,
                parent.segment,
                child.segment,
                parent.completed,
                child.invoked,
                child.completed,
            )
        )
    return windows


def segment_gap(
    sends: Iterable[Send], parents: Collection[int], children: Collection[int]
) -> float | None:
    """The hand-off seen by the whole segment: first acknowledgement on any child minus the
    last on any parent (``None`` when either side has none). Under steady load on the parent
    this is the time no write of its range was acknowledged, up to the inter-arrival time."""
    acked = [s for s in sends if s.outcome is Outcome.OK and s.completed is not None]
    on_parents = [s.completed for s in acked if s.segment in parents and s.completed is not None]
    on_children = [s.completed for s in acked if s.segment in children and s.completed is not None]
    if not on_parents or not on_children:
        return None
    return min(on_children) - max(on_parents)


@dataclass(frozen=True, slots=True)
class Summary:
    count: int
    p50: float
    p99: float
    max: float

    def ms(self) -> str:
        if not self.count:
            return "n=0"
        return (
            f"n={self.count} p50 {self.p50 * 1e3:.1f} ms, p99 {self.p99 * 1e3:.1f} ms, "
            f"max {self.max * 1e3:.1f} ms"
        )


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (the value at rank ``ceil(q * n)``)."""
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def summarize(values: Iterable[float]) -> Summary:
    ordered = sorted(values)
    if not ordered:
        return Summary(0, math.nan, math.nan, math.nan)
    return Summary(len(ordered), _quantile(ordered, 0.5), _quantile(ordered, 0.99), ordered[-1])

"""Ownership transfer of a segment between brokers as data (DESIGN §9, seed 004).

A move is recorded in the Segment's ``status.transfer`` (compare-and-swap, like
``status.operation`` for splits) before any broker is touched, and its ``phase`` names the last
step known complete:

``Releasing``
    The intent: the leader pre-assigned the destination. The destination catches up by copying
    the source's log, cursors, producers' last sequence ids and seal state while the source keeps
    serving; then the source is *fenced* (durably: it stores and acknowledges no publish, its
    clients stay connected) and the destination copies the final tail.
``Assigned``
    Recorded only once the destination's copy was seen equal to the fenced source's log.
``Owned``
    The commit: the same write names the destination in ``status.broker``. The destination is
    told it owns the segment (it then acknowledges publishes); the source closes its clients
    with the destination's URL and deletes its copy; the record is cleared.
``RollingBack``
    Written before the source is un-fenced, so that no later leader can commit a destination
    that misses entries the un-fenced source acknowledged.

:func:`next_action` is the whole decision: given the record and what the two brokers say now,
it returns the one step to take. It is what every leader runs, the first one and any that
finds the record after a crash, so a crash of the leader, the source or the destination at any
point leaves a record the next leader completes (from ``Owned`` only forward) or rolls back
(before ``Owned``, when the destination is unavailable). Safety rests on three rules:

* a broker accepts writes for the segment only while it is the source and not fenced, or the
  destination and told it owns it; the destination is told only after the commit, and the
  commit happens only with the source fenced and the destination's copy complete;
* the source is un-fenced only after ``RollingBack`` is recorded, and ``RollingBack`` can only
  replace a record before ``Owned``, so the two are never writable at once;
* the source deletes its copy only after the destination acknowledged ownership.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "ANNOTATION_BROKER",
    "CLOSE_SEGMENT_MOVED",
    "DRAIN_ANNOTATION",
    "ERR_SEGMENT_MOVED",
    "MOVED_VERSION",
    "Action",
    "BrokerView",
    "Endpoint",
    "SegmentRate",
    "ShedMove",
    "ShedPolicy",
    "Transfer",
    "TransferPhase",
    "TransferView",
    "broker_loads",
    "choose_shed",
    "is_orphan_copy",
    "moved_fields",
    "moved_to",
    "next_action",
    "pods_holding",
    "recorded_broker",
]

ANNOTATION_BROKER = "scalabletopics.io/broker"
"""On a Segment: the broker pod chosen for it, written with the Segment itself (before the
broker is asked to create the segment); ``status.broker`` follows once the broker has it."""

DRAIN_ANNOTATION = "scalabletopics.io/drain"
"""On a broker pod (``kubectl stopic drain POD``): placement stops choosing it and the leader
moves every segment away from it; removed by ``kubectl stopic uncordon POD``."""

CLOSE_SEGMENT_MOVED = 4011
"""Close code after the ``ERROR`` frame that tells a client where its segment went."""
ERR_SEGMENT_MOVED = "SegmentMoved"
MOVED_VERSION = 1
"""Version of the moved close frame's fields (``movedVersion``); a client that does not know a
higher version ignores the URL and rediscovers the owner through its DAG session."""


def moved_fields(url: str) -> dict[str, Any]:
    """The fields the source adds to its closing ``ERROR`` frame (seed 004's
    ``assignedBrokerServiceUrl``)."""
    return {"movedVersion": MOVED_VERSION, "assignedBrokerServiceUrl": url}


def moved_to(body: Mapping[str, Any], close_code: int | None) -> str | None:
    """The new owner's URL in a closing ``ERROR`` body, or None when the close is not a move
    this client understands."""
    if body.get("code") != ERR_SEGMENT_MOVED and close_code != CLOSE_SEGMENT_MOVED:
        return None
    version = body.get("movedVersion")
    url = body.get("assignedBrokerServiceUrl")
    if version != MOVED_VERSION or not isinstance(url, str) or not url:
        return None
    return url


class TransferPhase(enum.StrEnum):
    RELEASING = "Releasing"
    ASSIGNED = "Assigned"
    OWNED = "Owned"
    ROLLING_BACK = "RollingBack"


_FORWARD = (TransferPhase.RELEASING, TransferPhase.ASSIGNED, TransferPhase.OWNED)


class Action(enum.StrEnum):
    """The next step of a transfer; the leader executes it and asks again."""

    COPY = "copy"
    """Destination copies from the source what it lacks (catch-up or final tail)."""
    FENCE_SOURCE = "fence-source"
    """Source stops storing and acknowledging publishes, keeps its clients connected."""
    RECORD_ASSIGNED = "record-assigned"
    """CAS ``phase: Assigned`` (the fenced source and the destination hold the same log)."""
    COMMIT = "commit"
    """CAS ``phase: Owned`` and ``status.broker`` = destination in one write."""
    ACTIVATE_DESTINATION = "activate-destination"
    """Destination learns it owns the segment, acknowledges it, and admits held clients."""
    RELEASE_SOURCE = "release-source"
    """Source closes its clients with the destination's URL, then deletes its copy."""
    FINISH = "finish"
    """Clear ``status.transfer``; report the outcome."""
    RECORD_ROLLING_BACK = "record-rolling-back"
    """CAS ``phase: RollingBack``; must precede any un-fence."""
    UNFENCE_SOURCE = "unfence-source"
    """Source accepts writes again (closing its clients with its own URL so they re-send)."""
    DELETE_DESTINATION = "delete-destination"
    """Destination deletes its copy, which never owned the segment."""
    WAIT = "wait"
    """Nothing safe can be done until a broker comes back."""


def recorded_broker(segment: Mapping[str, Any]) -> str | None:
    """The broker pod a Segment was placed on (status first, then the creation annotation)."""
    pod = ((segment.get("status") or {}).get("broker") or {}).get("pod")
    if not pod:
        pod = ((segment.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_BROKER)
    return str(pod) if pod else None


def pods_holding(segment: Mapping[str, Any]) -> set[str]:
    """The broker pods that hold a copy of the Segment's log: the one it is placed on and, while
    a move is in flight, its source and destination. The placement names the destination from
    the ``Owned`` commit on, but the source deletes its copy only at the release after it, so a
    drained pod is empty only once no Segment's transfer names it either."""
    pods = {pod} if (pod := recorded_broker(segment)) else set()
    transfer = (segment.get("status") or {}).get("transfer") or {}
    for end in ("source", "destination"):
        if pod := (transfer.get(end) or {}).get("pod"):
            pods.add(str(pod))
    return pods


@dataclass(frozen=True)
class Endpoint:
    pod: str
    url: str

    def to_status(self) -> dict[str, str]:
        return {"pod": self.pod, "url": self.url}

    @classmethod
    def from_status(cls, data: Mapping[str, Any]) -> Endpoint:
        return cls(pod=str(data["pod"]), url=str(data["url"]))


@dataclass(frozen=True)
class Transfer:
    """A move in flight, as kept in ``Segment.status.transfer``."""

    id: str
    segment_id: int
    source: Endpoint
    destination: Endpoint
    phase: TransferPhase = TransferPhase.RELEASING
    trigger: str = "manual"
    reason: str = ""
    request_id: str | None = None
    started_at: str = ""

    def __post_init__(self) -> None:
        if self.source.pod == self.destination.pod:
            raise ValueError(
                f"segment {self.segment_id} already lives on {self.source.pod}: "
                "source and destination must differ"
            )

    def advanced(self, phase: TransferPhase) -> Transfer:
        """The record after ``phase``: forward one step at a time, or into ``RollingBack``
        from any phase before ``Owned``."""
        if phase is TransferPhase.ROLLING_BACK:
            if self.phase is TransferPhase.OWNED:
                raise ValueError(f"transfer {self.id}: ownership is committed, cannot roll back")
            return replace(self, phase=phase)
        if self.phase is TransferPhase.ROLLING_BACK:
            raise ValueError(f"transfer {self.id} is rolling back, cannot go to {phase}")
        current = _FORWARD.index(self.phase)
        target = _FORWARD.index(phase)
        if target not in (current, current + 1):
            raise ValueError(f"transfer {self.id}: cannot go from {self.phase} to {phase}")
        return replace(self, phase=phase)

    def to_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "id": self.id,
            "segmentId": self.segment_id,
            "source": self.source.to_status(),
            "destination": self.destination.to_status(),
            "phase": self.phase.value,
            "trigger": self.trigger,
            "reason": self.reason,
        }
        if self.request_id is not None:
            status["requestId"] = self.request_id
        if self.started_at:
            status["startedAt"] = self.started_at
        return status

    @classmethod
    def from_status(cls, data: Mapping[str, Any]) -> Transfer:
        try:
            return cls(
                id=str(data["id"]),
                segment_id=int(data["segmentId"]),
                source=Endpoint.from_status(data["source"]),
                destination=Endpoint.from_status(data["destination"]),
                phase=TransferPhase(data.get("phase", TransferPhase.RELEASING.value)),
                trigger=str(data.get("trigger", "manual")),
                reason=str(data.get("reason", "")),
                request_id=None if data.get("requestId") is None else str(data["requestId"]),
                started_at=str(data.get("startedAt", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed status.transfer: {exc!r}") from None


@dataclass(frozen=True)
class BrokerView:
    """What one broker says about its copy of the segment now (``up=False``: no answer)."""

    up: bool
    present: bool = False
    last_position: int = -1
    fenced: bool = False
    """Source: the transfer fence is on (durable). Destination: the copy is not yet owned."""
    cursors_digest: str = ""
    """A digest of the copy's cursors, seal and producers' sequence ids (equal copies agree)."""


@dataclass(frozen=True)
class TransferView:
    source: BrokerView
    destination: BrokerView


def _copies_equal(view: TransferView) -> bool:
    return (
        view.destination.present
        and view.destination.last_position == view.source.last_position
        and view.destination.cursors_digest == view.source.cursors_digest
    )


def next_action(transfer: Transfer, view: TransferView, *, catch_up_lag: int = 0) -> Action:
    """The one step to take now (see the module's rules).

    ``catch_up_lag`` is how many entries the destination may still lack when the source is
    fenced: the fenced window only covers copying that tail, so it does not grow with the log.
    """
    src, dst = view.source, view.destination
    phase = transfer.phase
    if phase is TransferPhase.ROLLING_BACK:
        if not src.up:
            return Action.WAIT
        if src.fenced:
            return Action.UNFENCE_SOURCE
        if dst.up and dst.present:
            return Action.DELETE_DESTINATION
        return Action.FINISH
    if phase is TransferPhase.OWNED:
        if not dst.up:
            return Action.WAIT
        if dst.fenced or not dst.present:
            return Action.ACTIVATE_DESTINATION
        if not src.up:
            return Action.WAIT
        if src.present:
            return Action.RELEASE_SOURCE
        return Action.FINISH
    if not src.up:
        # Releasing needs the source (the only full log); Assigned already verified the copy
        # against a durably fenced source, so it may commit without it.
        if phase is TransferPhase.ASSIGNED and dst.up and dst.present:
            return Action.COMMIT
        return Action.WAIT
    if not dst.up:
        return Action.RECORD_ROLLING_BACK
    if phase is TransferPhase.ASSIGNED:
        if src.fenced and _copies_equal(view):
            return Action.COMMIT
        # The record says the copy was complete, the brokers disagree (a destination that lost
        # its copy with its volume): only backwards is safe.
        return Action.RECORD_ROLLING_BACK
    if not src.fenced:
        if not dst.present or src.last_position - dst.last_position > catch_up_lag:
            return Action.COPY
        return Action.FENCE_SOURCE
    if not _copies_equal(view):
        return Action.COPY
    return Action.RECORD_ASSIGNED


def is_orphan_copy(
    *, broker_pod: str, owner_pod: str | None, transfer: Transfer | None, fenced: bool
) -> bool:
    """A fenced copy of a segment on a broker that neither owns it nor is the party of a
    transfer in flight is left over from a rolled-back or finished move: delete it.

    An unfenced copy is never an orphan by this rule (it may be the only log there is)."""
    if not fenced or broker_pod == owner_pod:
        return False
    parties = () if transfer is None else (transfer.source.pod, transfer.destination.pod)
    return broker_pod not in parties


# -- load shedding -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShedPolicy:
    """When the leader moves a segment off a hot broker (TransferShedder-style: the destination
    is chosen up front). A broker is hot when its load (the summed ``msgRateIn`` of its active
    segments, as the brokers report them) is above the brokers' mean by ``margin`` (0.5: 50 %)
    and at least ``min_rate``; at most one move per ``cooldown`` seconds."""

    enabled: bool = True
    margin: float = 0.5
    cooldown: float = 300.0
    min_rate: float = 1000.0

    def __post_init__(self) -> None:
        if self.margin < 0 or self.cooldown < 0 or self.min_rate < 0:
            raise ValueError("shedding margin, cooldown and min_rate must not be negative")


@dataclass(frozen=True)
class SegmentRate:
    key: tuple[str, str, int]
    """(namespace, topic, segment id)."""
    broker: str
    rate: float


@dataclass(frozen=True)
class ShedMove:
    key: tuple[str, str, int]
    source: str
    destination: str
    reason: str


def broker_loads(brokers: Iterable[str], segments: Iterable[SegmentRate]) -> dict[str, float]:
    loads = dict.fromkeys(brokers, 0.0)
    for s in segments:
        if s.broker in loads:
            loads[s.broker] += s.rate
    return loads


def choose_shed(
    brokers: Iterable[str],
    segments: Sequence[SegmentRate],
    policy: ShedPolicy,
    *,
    now: float,
    last_shed_at: float | None,
) -> ShedMove | None:
    """The one move that relieves the hottest broker, or None (disabled, in the cooldown, no
    broker hot enough, or no segment whose move would not just make another broker the hot
    one). ``brokers`` are those a segment may go to or come from (ready, not draining)."""
    if not policy.enabled:
        return None
    if last_shed_at is not None and now - last_shed_at < policy.cooldown:
        return None
    loads = broker_loads(brokers, segments)
    if len(loads) < 2:
        return None
    mean = sum(loads.values()) / len(loads)
    hot = max(sorted(loads), key=lambda b: loads[b])
    cold = min(sorted(loads), key=lambda b: loads[b])
    if loads[hot] < policy.min_rate or loads[hot] <= mean * (1 + policy.margin):
        return None
    # The destination's load after the move, compared as it will be computed: ``rate < hot -
    # cold`` can hold in floating point while ``cold + rate == hot`` (a move that narrows
    # nothing).
    movable = [
        s for s in segments if s.broker == hot and s.rate > 0 and loads[cold] + s.rate < loads[hot]
    ]
    if not movable:
        return None
    chosen = max(sorted(movable, key=lambda s: s.key), key=lambda s: s.rate)
    above = 100.0 * (loads[hot] / mean - 1) if mean > 0 else 0.0
    reason = (
        f"{hot} takes {loads[hot]:.0f} msg/s, {above:.0f} % above the brokers' mean "
        f"{mean:.0f} (margin {100 * policy.margin:.0f} %): its hottest movable segment "
        f"({chosen.rate:.0f} msg/s) goes to {cold} ({loads[cold]:.0f} msg/s)"
    )
    return ShedMove(chosen.key, hot, cold, reason)

"""The leader's side of an ownership transfer (DESIGN §9; ``core.transfer`` decides, this module
observes the two brokers, executes the decided step and records the phases on the Segment).

A move is recorded in ``Segment.status.transfer`` with a compare-and-swap before any broker is
touched; every later phase is a compare-and-swap on the Segment too, the commit (``Owned``) in
the same write that names the destination in ``status.broker``. Each step is idempotent on the
brokers, so a new leader that finds the record asks both brokers where they are and goes on
from there (``next_action``): the crash of a leader, a source or a destination at any point is
completed, or rolled back before the commit.

``SCALABLE_TOPICS_FAULT=crash-after:<point>`` (the hook of ``controller.protocol``) SIGKILLs the
process right after ``transfer-recorded``, ``transfer-fenced``, ``transfer-assigned``,
``transfer-committed``, ``transfer-owned`` or ``transfer-released``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from prometheus_client import Counter

from ..brokeradmin import AdminError
from ..core.jsontypes import JsonObj
from ..core.resources import (
    LastRequest,
    ManualRequest,
    ManualRequestOp,
    RequestResult,
    format_time,
)
from ..core.topicstatus import with_request_outcome
from ..core.transfer import (
    Action,
    BrokerView,
    Endpoint,
    ShedMove,
    ShedPolicy,
    Transfer,
    TransferPhase,
    TransferView,
    choose_shed,
    next_action,
    pods_holding,
    recorded_broker,
)
from ..transferadmin import TransferAdmin, copy
from .brokers import BrokerAdmin, BrokerPod, choose_broker
from .cache import TopicCache
from .faults import crash_after, fault_point
from .kube import Conflict, KubeApi
from .status import change_topic_status, reread_segment

log = logging.getLogger(__name__)

MOVE_RECORD_ATTEMPTS = 5
"""Reads of a Segment that changed under a manual move's record before the move is rejected."""

TRANSFER_FAULT_POINTS = (
    "transfer-recorded",
    "transfer-fenced",
    "transfer-assigned",
    "transfer-committed",
    "transfer-owned",
    "transfer-released",
)
CATCH_UP_LAG = 1000
"""Entries the destination may still lack when the source is fenced: the fenced window copies
only this tail, whatever the log's size."""
CATCH_UP_PASSES = 8
"""Catch-up passes before the source is fenced anyway (producers outrunning the copy)."""
MAX_STEPS = 64
RETRY_AFTER = 2.0
SHED_DECISION_SECONDS = 1.0
"""How long one load-shedding decision serves the reconciles that ask for it: it scans every
Segment, and made per reconcile it cost O(topics²) per resync pass (10,000 topics: 200 million
Segment reads every pass). Broker load reports come every 10 s, so a second-old decision is
current."""

EventSink = Callable[[JsonObj, str, str, str], Awaitable[None]]
Requeue = Callable[[tuple[str, str], float], None]


LOAD_SHEDS = Counter(
    "scalable_topic_load_sheds_total",
    "Segments the leader moved off a broker whose load was above the brokers' mean "
    "(load shedding; the reason is in the LoadShed event and the log).",
)


class MoveRejected(Exception):
    """A move request that cannot start; the message says why."""


class TransferExecutor:
    def __init__(
        self,
        kube: KubeApi,
        brokers: BrokerAdmin,
        cache: TopicCache,
        *,
        events: EventSink,
        requeue: Callable[[], Requeue | None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.brokers = brokers
        self.cache = cache
        self.events = events
        self.requeue = requeue
        self.clock = clock
        self.fault = fault_point(TRANSFER_FAULT_POINTS)
        self._fenced_at: dict[str, float] = {}
        self._announced: set[str] = set()
        """Draining pods whose ``Drained`` event was posted (again after an uncordon)."""
        self.shed_policy = ShedPolicy()
        self._last_shed_at: float | None = None
        self._shed_decision: tuple[float, ShedMove | None] | None = None
        """``(when made, move)``: see :data:`SHED_DECISION_SECONDS`."""
        self._decision_clock: Callable[[], float] = time.monotonic

    def _crash_point(self, point: str) -> None:
        crash_after(self.fault, point)

    # -- entry points --------------------------------------------------------------------------

    async def start(self, topic: JsonObj, request: ManualRequest) -> JsonObj:
        """Record a manual move and drive it; :class:`MoveRejected` when it cannot start.

        The record is a compare-and-swap on the Segment as the cache holds it, and a broker's
        load report may have changed the Segment since: then the move is checked again on the
        Segment as the API server has it, up to ``MOVE_RECORD_ATTEMPTS`` times, and rejected
        only if the Segment keeps changing (or no longer allows the move)."""
        assert request.to is not None
        meta = topic["metadata"]
        ns, name = meta["namespace"], meta["name"]
        sid = request.segments[0]
        if (topic.get("status") or {}).get("operation"):
            raise MoveRejected("a split or merge is in flight; try again after it")
        segment = self.cache.segments.get((ns, name), {}).get(sid)
        for _ in range(MOVE_RECORD_ATTEMPTS):
            if segment is None:
                raise MoveRejected(f"segment {sid} has no Segment resource")
            try:
                return await self._start_on(topic, segment, request)
            except Conflict:
                segment = await reread_segment(self.kube, self.cache, segment)
        raise MoveRejected(f"segment {sid} kept changing while the move was recorded")

    async def _start_on(self, topic: JsonObj, segment: JsonObj, request: ManualRequest) -> JsonObj:
        """:meth:`start` on ``segment`` as read; :class:`Conflict` if it changed since."""
        assert request.to is not None
        sid = request.segments[0]
        status = segment.get("status") or {}
        if status.get("transfer"):
            current = Transfer.from_status(status["transfer"])
            if current.request_id == request.id:
                return await self.drive(topic, sid)
            raise MoveRejected(f"segment {sid} is already moving ({current.id})")
        source_pod = recorded_broker(segment)
        source_url = (status.get("broker") or {}).get("url")
        if source_pod is None or not source_url:
            raise MoveRejected(f"segment {sid} is not placed on a broker yet")
        if source_pod == request.to:
            return await self._report(
                topic, request.id, "Succeeded", f"segment {sid} is on {request.to} already"
            )
        destination = self.cache.brokers.get(request.to)
        if destination is None or not destination.ready:
            raise MoveRejected(f"{request.to} is not a ready broker pod")
        if destination.cordoned:
            raise MoveRejected(f"{request.to} is draining (kubectl stopic uncordon {request.to})")
        return await self._begin(
            topic,
            segment,
            Endpoint(source_pod, str(source_url)),
            destination,
            trigger="manual",
            reason=f"request {request.id}",
            request_id=request.id,
        )

    async def _begin(
        self,
        topic: JsonObj,
        segment: JsonObj,
        source: Endpoint,
        destination: BrokerPod,
        *,
        trigger: str,
        reason: str,
        request_id: str | None = None,
    ) -> JsonObj:
        sid = int(segment["spec"]["segmentId"])
        transfer = Transfer(
            id=f"move-{uuid.uuid4().hex[:8]}",
            segment_id=sid,
            source=source,
            destination=Endpoint(destination.name, destination.url),
            trigger=trigger,
            reason=reason,
            request_id=request_id,
            started_at=format_time(self.clock()),
        )
        await self._write(segment, {"transfer": transfer.to_status()})
        meta = topic["metadata"]
        log.info(
            "transfer %s: segment %s/%s/%d %s -> %s recorded (%s)",
            transfer.id,
            meta["namespace"],
            meta["name"],
            sid,
            source.pod,
            destination.name,
            reason,
        )
        self._crash_point("transfer-recorded")
        return await self.drive(topic, sid)

    async def drain(self, topic: JsonObj) -> JsonObj:
        """Move every segment of the topic off the cordoned (draining) broker pods, each to
        the least loaded ready broker that is not draining; then announce, once, each
        draining pod that holds no Segment's log any more (:func:`pods_holding`: placed on it or
        moving from or to it) with a ``Drained`` event on the pod."""
        meta = topic["metadata"]
        cordoned = {name for name, pod in self.cache.brokers.items() if pod.cordoned}
        self._announced &= cordoned
        if not cordoned:
            return topic
        if not (topic.get("status") or {}).get("operation"):
            segments = self.cache.segments.get((meta["namespace"], meta["name"]), {})
            for sid in sorted(segments):
                segment = segments[sid]
                status = segment.get("status") or {}
                pod = recorded_broker(segment)
                url = (status.get("broker") or {}).get("url")
                if status.get("transfer") or pod not in cordoned or not url:
                    continue
                destination = choose_broker(self.cache.brokers.values(), self.cache.broker_load())
                if destination is None:
                    log.warning("no broker to drain segment %d of %s to", sid, meta["name"])
                    break
                try:
                    topic = await self._begin(
                        topic,
                        segment,
                        Endpoint(str(pod), str(url)),
                        destination,
                        trigger="drain",
                        reason=f"{pod} is draining",
                    )
                except Conflict:
                    continue  # the Segment changed: the next pass looks again
        for pod in sorted(cordoned - self._announced):
            if not any(
                pod in pods_holding(s)
                for segments in self.cache.segments.values()
                for s in segments.values()
            ):
                self._announced.add(pod)
                await self.events(
                    self.cache.brokers[pod].event_target(),
                    "Normal",
                    "Drained",
                    f"no segment is on {pod} any more; it can be stopped or scaled away",
                )
                log.info("broker %s is drained", pod)
        return topic

    async def resume(self, topic: JsonObj) -> JsonObj:
        """Drive every transfer of the topic found in its Segments (a new leader's pass)."""
        meta = topic["metadata"]
        for sid, segment in sorted(
            self.cache.segments.get((meta["namespace"], meta["name"]), {}).items()
        ):
            if (segment.get("status") or {}).get("transfer"):
                topic = await self.drive(topic, sid)
        return topic

    async def shed(self, topic: JsonObj) -> JsonObj:
        """Load shedding: when a broker's load stays above the mean (``core.transfer``'s
        ``choose_shed``, over every Active segment the cache knows, one move at a time, a
        cooldown between moves), move its hottest movable segment if it is this topic's."""
        if not self.shed_policy.enabled or (topic.get("status") or {}).get("operation"):
            return topic
        move = self._shed_move()
        meta = topic["metadata"]
        if move is None or move.key[:2] != (meta["namespace"], meta["name"]):
            return topic
        segment = self.cache.segments[(meta["namespace"], meta["name"])][move.key[2]]
        url = ((segment.get("status") or {}).get("broker") or {}).get("url")
        if not url:
            return topic
        self._last_shed_at = self.clock()
        self._shed_decision = None
        LOAD_SHEDS.inc()
        await self.events(topic, "Normal", "LoadShed", f"segment {move.key[2]}: {move.reason}")
        log.info("load shedding: segment %s: %s", move.key, move.reason)
        try:
            return await self._begin(
                topic,
                segment,
                Endpoint(move.source, str(url)),
                self.cache.brokers[move.destination],
                trigger="shed",
                reason=move.reason,
            )
        except Conflict:
            return topic

    def _shed_move(self) -> ShedMove | None:
        """The current load-shedding decision, made again once it is older than
        :data:`SHED_DECISION_SECONDS`."""
        now = self._decision_clock()
        if self._shed_decision is not None and now - self._shed_decision[0] < SHED_DECISION_SECONDS:
            return self._shed_decision[1]
        rates = self.cache.active_rates()
        move = None
        if rates is not None:
            eligible = sorted(
                n for n, p in self.cache.brokers.items() if p.ready and not p.cordoned
            )
            move = choose_shed(
                eligible, rates, self.shed_policy, now=self.clock(), last_shed_at=self._last_shed_at
            )
        self._shed_decision = (now, move)
        return move

    # -- the loop -------------------------------------------------------------------------------

    def _segment(self, topic: JsonObj, sid: int) -> JsonObj | None:
        meta = topic["metadata"]
        return self.cache.segments.get((meta["namespace"], meta["name"]), {}).get(sid)

    def _admin(self, topic: JsonObj, endpoint: Endpoint, sid: int) -> TransferAdmin:
        pod = self.cache.brokers.get(endpoint.pod)
        url = pod.url if pod is not None else endpoint.url
        meta = topic["metadata"]
        return TransferAdmin(self.brokers.at(url), meta["namespace"], meta["name"], sid)

    async def _view(self, topic: JsonObj, transfer: Transfer) -> tuple[BrokerView, BrokerView]:
        views = []
        for endpoint, fence_key in ((transfer.source, "releasing"), (transfer.destination, None)):
            pod = self.cache.brokers.get(endpoint.pod)
            if pod is None or not pod.ready:
                views.append(BrokerView(up=False))
                continue
            try:
                snap = await self._admin(topic, endpoint, transfer.segment_id).snapshot()
            except AdminError as exc:
                log.info("transfer %s: %s does not answer: %s", transfer.id, endpoint.pod, exc)
                views.append(BrokerView(up=False))
                continue
            if snap is None:
                views.append(BrokerView(up=True))
                continue
            fenced = (
                snap.get("fenceReason") == fence_key
                if fence_key is not None
                else not bool(snap.get("writable"))
            )
            views.append(
                BrokerView(
                    up=True,
                    present=True,
                    last_position=int(snap["lastPosition"]),
                    fenced=fenced,
                    cursors_digest=str(snap.get("digest", "")),
                )
            )
        return views[0], views[1]

    async def drive(self, topic: JsonObj, sid: int) -> JsonObj:
        """Take steps until the transfer ends or has to wait for a broker."""
        catch_up = 0
        for _ in range(MAX_STEPS):
            segment = self._segment(topic, sid)
            raw = (segment or {}).get("status", {}).get("transfer") if segment else None
            if segment is None or not raw:
                return topic
            transfer = Transfer.from_status(raw)
            src, dst = await self._view(topic, transfer)
            lag = CATCH_UP_LAG if catch_up < CATCH_UP_PASSES else 1 << 62
            action = next_action(transfer, TransferView(src, dst), catch_up_lag=lag)
            log.debug("transfer %s: %s (%s, %s)", transfer.id, action, src, dst)
            if action is Action.WAIT:
                self._retry_later(topic)
                return topic
            try:
                topic = await self._execute(topic, segment, transfer, action)
            except Conflict:
                # A broker's load report landed on the Segment after the cache read it (every
                # few seconds): nothing was written; read it again and decide again.
                await reread_segment(self.kube, self.cache, segment)
                continue
            except AdminError as exc:
                log.warning("transfer %s: %s failed: %s", transfer.id, action, exc)
                if exc.status in (0, 502, 503, 504) or transfer.phase in (
                    TransferPhase.OWNED,
                    TransferPhase.ROLLING_BACK,
                ):
                    continue  # the next observation sees the broker away (or retries)
                await self._write(
                    segment, {"transfer": transfer.advanced(TransferPhase.ROLLING_BACK).to_status()}
                )
                await self.events(
                    topic, "Warning", "MoveRollingBack", f"{transfer.id}: {action} failed: {exc}"
                )
            if action is Action.COPY and not src.fenced:
                catch_up += 1
        # Steps that did not end it (a broker failing each one): without a retry nothing would
        # drive it again before the next event on the topic or the periodic resync.
        log.warning(
            "transfer of segment %d: not finished after %d steps; again later", sid, MAX_STEPS
        )
        self._retry_later(topic)
        return topic

    def _retry_later(self, topic: JsonObj) -> None:
        requeue = self.requeue()
        if requeue is not None:
            meta = topic["metadata"]
            requeue((meta["namespace"], meta["name"]), RETRY_AFTER)

    async def _execute(
        self, topic: JsonObj, segment: JsonObj, transfer: Transfer, action: Action
    ) -> JsonObj:
        sid = transfer.segment_id
        source = self._admin(topic, transfer.source, sid)
        destination = self._admin(topic, transfer.destination, sid)
        if action is Action.COPY:
            report = await copy(source, destination)
            log.info(
                "transfer %s: copied %d entries (%d bytes) in %.3f s, destination at %d/%d",
                transfer.id,
                report.entries,
                report.bytes,
                report.seconds,
                report.last_position,
                report.source_last_position,
            )
        elif action is Action.FENCE_SOURCE:
            await source.fence()
            self._fenced_at[transfer.id] = time.monotonic()
            self._crash_point("transfer-fenced")
        elif action is Action.RECORD_ASSIGNED:
            await self._write(
                segment, {"transfer": transfer.advanced(TransferPhase.ASSIGNED).to_status()}
            )
            self._crash_point("transfer-assigned")
        elif action is Action.COMMIT:
            await self._write(
                segment,
                {
                    "transfer": transfer.advanced(TransferPhase.OWNED).to_status(),
                    "broker": transfer.destination.to_status(),
                },
            )
            self._crash_point("transfer-committed")
        elif action is Action.ACTIVATE_DESTINATION:
            await destination.own()
            self._crash_point("transfer-owned")
        elif action is Action.RELEASE_SOURCE:
            released = await source.release(destination.admin.url)  # the destination's URL
            if released is not None:
                await destination.state(released["cursors"], None)
            self._crash_point("transfer-released")
        elif action is Action.RECORD_ROLLING_BACK:
            await self._write(
                segment, {"transfer": transfer.advanced(TransferPhase.ROLLING_BACK).to_status()}
            )
        elif action is Action.UNFENCE_SOURCE:
            await source.unfence()
        elif action is Action.DELETE_DESTINATION:
            meta = topic["metadata"]
            await destination.admin.delete_segment(meta["namespace"], meta["name"], sid)
        elif action is Action.FINISH:
            return await self._finish(topic, segment, transfer)
        return topic

    async def _finish(self, topic: JsonObj, segment: JsonObj, transfer: Transfer) -> JsonObj:
        await self._write(segment, {"transfer": None})
        fenced_at = self._fenced_at.pop(transfer.id, None)
        window = "" if fenced_at is None else f", fenced {time.monotonic() - fenced_at:.3f} s"
        if transfer.phase is TransferPhase.OWNED:
            message = (
                f"segment {transfer.segment_id} moved from {transfer.source.pod} to "
                f"{transfer.destination.pod} ({transfer.id}, {transfer.reason}{window})"
            )
            await self.events(topic, "Normal", "Moved", message)
            result = "Succeeded"
        else:
            message = (
                f"segment {transfer.segment_id} stays on {transfer.source.pod}: the move to "
                f"{transfer.destination.pod} was rolled back ({transfer.id})"
            )
            await self.events(topic, "Warning", "MoveRolledBack", message)
            result = "Failed"
        log.info("transfer %s: %s", transfer.id, message)
        if transfer.request_id is None:
            return topic
        return await self._report(topic, transfer.request_id, result, message)

    async def _report(self, topic: JsonObj, request_id: str, result: str, message: str) -> JsonObj:
        meta = topic["metadata"]
        outcome = LastRequest(
            id=request_id,
            op=ManualRequestOp.MOVE,
            result=RequestResult(result),
            message=message,
            completed_at=format_time(self.clock()),
        )
        return await change_topic_status(
            self.kube,
            meta["namespace"],
            meta["name"],
            lambda status, _: with_request_outcome(status, outcome),
            topic=topic,
        )

    async def _write(self, segment: JsonObj, status: JsonObj) -> None:
        """CAS on the Segment: the write carries the resourceVersion it was read at."""
        meta = segment["metadata"]
        updated = await self.kube.patch_segment_status(
            meta["namespace"], meta["name"], status, resource_version=meta["resourceVersion"]
        )
        self.cache.put_segment(updated)

"""The split/merge/rebucket protocol of DESIGN §5, executed step by step, crash-safe.

1. record the intent in ``status.operation`` (CAS);
2. discover the subscriptions (spec + the parents' brokers);
3. create the children: Segment resources, placement, then the segments on their brokers with a
   cursor at the start for every subscription, *fenced* (they refuse produce) — phase
   ``ChildrenCreated``;
4. terminate the parents on their brokers with the successors' ranges and URLs (producers are
   redirected without a lookup), and only then activate the children (a producer redirected
   meanwhile is held by the child's broker until it opens), so no moment exists at which a
   parent and one of its children both accept writes; the phase ``ParentsSealed`` is recorded
   after the activation (a new leader learns a seal from the brokers too);
5. CAS the new layout into ``status.layout`` and clear the intent in the same write;
6. mark the Segments, tell the consumer hub, emit an event, count it.

Each step is idempotent, so a new leader re-runs the step it finds recorded (or the one after).
Before any parent is sealed the operation may be rolled back; after that only forward is safe
(see ``core.operation.recovery``). Step 6 is also what the reconciler does level-based for any
committed layout, so a crash after step 5 loses at most an event.

``SCALABLE_TOPICS_FAULT=crash-after:<point>`` makes the process SIGKILL itself right after that
point (``intent-recorded``, ``children-created``, ``parents-sealed``, ``children-activated``,
``layout-committed``) —
the hook the crash tests use. It is read at start-up and never set in production manifests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from collections.abc import Set as AbstractSet
from typing import Any, TypeVar, cast

from ..brokeradmin import AdminError
from ..core.evaluator import zero_load_status
from ..core.jsontypes import JsonObj
from ..core.layout import SegmentLayout
from ..core.operation import Operation, Phase, Recovery, recovery
from ..core.resources import (
    format_time,
    parse_topic_spec,
    segment_manifest,
    segment_name,
)
from ..core.subscriptions import BrokerSubscriptionType
from ..core.topicstatus import (
    StatusConflict,
    commit_operation,
    record_intent,
    record_phase,
    roll_back_operation,
)
from ..core.transfer import ANNOTATION_BROKER, recorded_broker
from ..core.wire import Successor
from . import metrics
from .brokers import BrokerAdmin, broker_unavailable, choose_broker
from .cache import TopicCache, layout_of
from .faults import crash_after, fault_point
from .kube import Conflict, KubeApi
from .status import TypedChange, change_topic_status, reread_segment

log = logging.getLogger(__name__)
T = TypeVar("T")

PLACEMENT_ATTEMPTS = 3
"""Compare-and-swaps of a new segment's placement and zero load before it is written without
the load (the Segment kept changing; it then has no load until its broker sees traffic)."""

FAULT_POINTS = (
    "intent-recorded",
    "children-created",
    "parents-sealed",
    "children-activated",
    "layout-committed",
)

EventSink = Callable[[JsonObj, str, str, str], Awaitable[None]]
LayoutListener = Callable[[str, str, SegmentLayout], None]


class OperationRejected(Exception):
    """The operation cannot start (another is in flight, or the layout moved on)."""


class NoBrokerAvailable(Exception):
    pass


def broker_retention(topic: JsonObj) -> dict[str, int] | None:
    """The spec's retention (``time: 1h``, ``size: 1Gi``) in the broker's units
    (``timeMs``, ``sizeBytes``); ``None`` when the topic sets none."""
    retention = parse_topic_spec(topic.get("spec")).retention
    if retention is None:
        return None
    body: dict[str, int] = {}
    if retention.time is not None:
        body["timeMs"] = int(retention.time * 1000)
    if retention.size is not None:
        body["sizeBytes"] = int(retention.size)
    return body or None


class OperationExecutor:
    def __init__(
        self,
        kube: KubeApi,
        brokers: BrokerAdmin,
        cache: TopicCache,
        *,
        events: EventSink,
        on_layout: LayoutListener | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.brokers = brokers
        self.cache = cache
        self.events = events
        self.on_layout = on_layout
        self.clock = clock
        self.fault = fault_point(FAULT_POINTS)

    def _crash_point(self, point: str) -> None:
        crash_after(self.fault, point)

    # -- entry points --------------------------------------------------------------------------

    async def start(self, topic: JsonObj, operation: Operation) -> JsonObj:
        """Record the intent (step 1) and run the operation to its end.

        :class:`OperationRejected` while a parent is moving to another broker: a seal and a
        copy of the same log must not interleave, so the operation waits for the move (which
        in turn refuses to start while an operation is in flight)."""
        meta = topic["metadata"]
        segments = self.cache.segments.get((meta["namespace"], meta["name"]), {})
        moving = [
            sid
            for sid in operation.parents
            if ((segments.get(sid) or {}).get("status") or {}).get("transfer")
        ]
        if moving:
            raise OperationRejected(
                f"segment(s) {moving} are moving to another broker; the {operation.kind} can "
                "start once the move has ended"
            )

        topic = await self._change(
            topic, lambda status, _: record_intent(status, operation), fresh=True
        )
        log.info(
            "%s/%s: %s %s recorded (%s)",
            meta["namespace"],
            meta["name"],
            operation.kind,
            operation.id,
            operation.reason,
        )
        self._crash_point("intent-recorded")
        return await self.run(topic, operation)

    async def resume(self, topic: JsonObj) -> JsonObj:
        """A leader found ``status.operation``: finish it or roll it back."""
        meta = topic["metadata"]
        operation = Operation.from_status(topic["status"]["operation"])
        # A new leader's watch cache may not hold every Segment yet; where the parents and
        # children live is exactly what recovery needs.
        for body in await self.kube.list_segments(meta["namespace"], meta["name"]):
            self.cache.put_segment(body)
        layout = layout_of(topic)
        if layout is None:
            return await self.roll_back(topic, operation, "the topic has no layout")
        sealed = await self._any_parent_sealed(topic, operation)
        decision = recovery(operation, layout, any_parent_sealed=sealed)
        log.warning(
            "%s/%s: resuming %s %s at phase %s: %s",
            meta["namespace"],
            meta["name"],
            operation.kind,
            operation.id,
            operation.phase,
            decision,
        )
        if decision is Recovery.ROLL_BACK:
            return await self.roll_back(
                topic, operation, "the layout changed before any parent was sealed"
            )
        if sealed and operation.phase is Phase.INTENT:
            operation = operation.advanced(Phase.CHILDREN_CREATED)
        return await self.run(topic, operation)

    async def run(self, topic: JsonObj, operation: Operation) -> JsonObj:
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        started = self.clock()
        if operation.phase is Phase.INTENT:
            await self._create_children(topic, operation)
            operation = operation.advanced(Phase.CHILDREN_CREATED)
            # The parents' producers connect to the children (held) while the phase is written
            # and the parents sealed, so that the connection is not in their blocked window.
            topic, _ = await asyncio.gather(
                self._record_phase(topic, operation), self._announce_successors(topic, operation)
            )
            self._crash_point("children-created")
        if operation.phase is Phase.CHILDREN_CREATED:
            by_seal = await self._seal_parents(topic, operation)
            sealed = time.monotonic()
            self._crash_point("parents-sealed")
            operation = operation.advanced(Phase.PARENTS_SEALED)
            # Producers redirected by the seal wait for the activation: the phase record (an API
            # server write) comes after it, so that not even the record's encoding delays the
            # activation requests on this event loop. A leader that dies with the children open
            # and the phase not recorded is safe: recovery asks the parents' brokers.
            await self._activate_children(topic, operation, opened=by_seal)
            opened = time.monotonic()
            self._crash_point("children-activated")
            topic = await self._record_phase(topic, operation)
            log.info(
                "%s/%s: %s %s: children open %.1f ms after the parents' seal (%d of %d opened "
                "by their parent's broker with the seal; phase recorded %.1f ms later)",
                ns,
                name,
                operation.kind,
                operation.id,
                1000 * (opened - sealed),
                len(by_seal),
                len(operation.children),
                1000 * (time.monotonic() - opened),
            )
        else:
            await self._activate_children(topic, operation)
        topic = await self._commit(topic, operation)
        self._crash_point("layout-committed")
        metrics.OPERATION_SECONDS.labels(operation.kind.value).observe(self.clock() - started)
        metrics.OPERATIONS.labels(
            ns, name, operation.kind.value, operation.source, "committed"
        ).inc()
        await self._finish(topic, operation)
        return topic

    # -- steps ---------------------------------------------------------------------------------

    async def _subscriptions(self, topic: JsonObj, operation: Operation) -> list[tuple[str, str]]:
        """Step 2: the spec's subscriptions plus any the parents' brokers know about."""
        spec = parse_topic_spec(topic.get("spec"))
        found: dict[str, str] = {s.name: s.type.value for s in spec.subscriptions}
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        urls = self.cache.segment_brokers(ns, name)
        for parent in operation.parents:
            url = urls.get(parent)
            if not url:
                continue
            stats = await self.brokers.at(url).find_stats(ns, name, parent)
            for sub, info in ((stats or {}).get("subscriptions") or {}).items():
                if sub not in found:
                    kind = BrokerSubscriptionType.parse(str((info or {}).get("type", "Exclusive")))
                    found[sub] = kind.subscription_type.value
        return sorted(found.items())

    def _place(
        self, topic: JsonObj, segment_id: int, existing: JsonObj | None, parents: list[int]
    ) -> tuple[str, str]:
        """The broker (pod, url) of a segment: the recorded one, else the least loaded (a
        split's child: its parent's, when that keeps the brokers balanced; ``choose_broker``).

        A segment stays where it was placed unless an ownership transfer moves it
        (``controller.transfer``): its log lives on its broker's volume, and a StatefulSet pod
        comes back with the same name and volume. While the recorded pod is away this raises
        ``AdminError`` (the topic waits, ``BrokersUnavailable``) instead of placing the segment
        again, empty, somewhere else."""
        recorded = recorded_broker(existing) if existing is not None else None
        if recorded:
            pod = self.cache.brokers.get(recorded)
            if pod is None:
                raise broker_unavailable(
                    f"broker pod {recorded} of segment {segment_id} is not running", "BrokerAway"
                )
            return pod.name, pod.url
        beside = None
        if len(parents) == 1:
            ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
            parent = self.cache.segments.get((ns, name), {}).get(parents[0])
            beside = recorded_broker(parent) if parent is not None else None
        choice = choose_broker(self.cache.brokers.values(), self.cache.broker_load(), beside=beside)
        if choice is None:
            raise NoBrokerAvailable("no ready segment broker")
        return choice.name, choice.url

    async def ensure_segment(
        self,
        topic: JsonObj,
        segment_id: int,
        hash_range: Any,
        parents: list[int],
        buckets: int,
        subscriptions: list[tuple[str, str]],
        *,
        state: str = "Pending",
        writable: bool = True,
        epochs: Mapping[str, Any] | None = None,
        placed: list[str] | None = None,
    ) -> str:
        """Segment resource + placement + segment on its broker; returns the broker URL.

        The placement is chosen first and written with the Segment itself (annotation
        ``scalabletopics.io/broker``), so a crash before the broker has the segment cannot
        leave it on a broker nobody knows about. Once the broker has it, one status patch
        records the broker, the subscriptions and ``state`` (a ``Pending`` segment becomes
        ``state``; a later state is kept): a segment is never Active before its broker has
        it.

        ``writable=False`` creates it fenced (a child before its parents are sealed); with the
        default a fenced segment found on the broker is activated — the layout has it active.
        ``epochs``: the layout's epochs of the segment, recorded in the same status patch."""
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        existing = self.cache.segments.get((ns, name), {}).get(segment_id)
        newly_placed = existing is None or recorded_broker(existing) is None
        pod, url = self._place(topic, segment_id, existing, parents)
        body = segment_manifest(
            topic=name,
            namespace=ns,
            topic_uid=topic["metadata"]["uid"],
            segment_id=segment_id,
            hash_range=hash_range,
            parents=parents,
            buckets=buckets,
        )
        body["metadata"]["annotations"] = {ANNOTATION_BROKER: pod}
        created = await self.kube.create_segment(body)
        if recorded_broker(created) not in (None, pod):
            # The cache did not have it yet: the placement on record wins.
            pod, url = self._place(topic, segment_id, created, parents)
            newly_placed = False
        self.cache.put_segment(created)
        if newly_placed:
            log.info(
                "%s/%s: placed segment %d (%s) on %s", ns, name, segment_id, hash_range.hex(), pod
            )
            placement = f"segment #{segment_id} {hash_range.hex()} on {pod}"
            if placed is None:
                await self.events(topic, "Normal", "Placed", placement)
            else:
                placed.append(placement)
        retention = broker_retention(topic)
        admin = self.brokers.at(url)
        status = created.get("status") or {}
        record_zero = "load" not in status
        on_broker = await admin.create_segment(
            ns,
            name,
            segment_id,
            hash_range.start,
            hash_range.end,
            subscriptions=subscriptions,
            buckets=buckets,
            retention=retention,
            writable=writable,
            zero_load_recorded=record_zero,
        )
        if writable and on_broker.get("writable") is False:
            await admin.activate(ns, name, segment_id)
        current = status.get("state")
        wanted: dict[str, Any] = {
            "broker": {"pod": pod, "url": url},
            "state": state if current in (None, "", "Pending") else current,
            # The spec's subscriptions, which the reconciler keeps in sync; ones found only on
            # a parent's broker (step 2) are created here too but are not the spec's to manage.
            "subscriptions": sorted(
                sub.name for sub in parse_topic_spec(topic.get("spec")).subscriptions
            ),
            **(epochs or {}),
        }
        if record_zero:
            await self._record_placement(created, wanted)
        elif any(status.get(k) != v for k, v in wanted.items()):
            updated = await self.kube.patch_segment_status(ns, body["metadata"]["name"], wanted)
            self.cache.put_segment(updated)
        return url

    async def _record_placement(self, segment: JsonObj, wanted: JsonObj) -> None:
        """Write a placement together with the new segment's zero load (whose broker was told
        so and writes only a move from zero): one status write instead of two per segment.
        A compare-and-swap, so that it never writes zero over a load its broker wrote after
        all (its broker restarted in between, say): on a conflict it looks again."""
        meta = segment["metadata"]
        for _ in range(PLACEMENT_ATTEMPTS):
            status = segment.get("status") or {}
            record = {**wanted}
            if "load" not in status:
                record["load"] = zero_load_status(format_time(self.clock()))
            try:
                updated = await self.kube.patch_segment_status(
                    meta["namespace"],
                    meta["name"],
                    record,
                    resource_version=segment["metadata"]["resourceVersion"],
                )
            except Conflict:
                fresh = await reread_segment(self.kube, self.cache, segment)
                if fresh is None:
                    raise
                segment = fresh
                continue
            self.cache.put_segment(updated)
            return
        updated = await self.kube.patch_segment_status(meta["namespace"], meta["name"], wanted)
        self.cache.put_segment(updated)

    async def _create_children(self, topic: JsonObj, operation: Operation) -> None:
        subscriptions = await self._subscriptions(topic, operation)
        placed: list[str] = []
        try:
            for child in operation.children:
                await self.ensure_segment(
                    topic,
                    child.segment_id,
                    child.hash_range,
                    list(child.parent_ids),
                    child.buckets,
                    subscriptions,
                    writable=False,
                    placed=placed,
                )
        finally:
            await self.announce_placed(topic, placed)

    async def announce_placed(
        self, topic: JsonObj, placed: list[str], *, created: SegmentLayout | None = None
    ) -> None:
        """One ``Placed`` event for the segments a pass placed (``ensure_segment(placed=)``):
        a split costs one event, not one per segment. For a topic whose first layout this pass
        ``created``, the one ``Created`` event names the placements: one event per new topic,
        not two."""
        if created is not None:
            message = f"created {len(created.active())} segment(s) at epoch {created.epoch}"
            if placed:
                message += ": " + "; ".join(placed)
            await self.events(topic, "Normal", "Created", message)
        elif placed:
            await self.events(topic, "Normal", "Placed", "; ".join(placed))

    async def _announce_successors(self, topic: JsonObj, operation: Operation) -> None:
        """Name the children to the parents' producers ahead of the seal (best effort: the
        seal names them again as it begins)."""
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        urls = self.cache.segment_brokers(ns, name)

        async def announce(parent: int) -> None:
            url = urls.get(parent)
            if not url:
                return
            try:
                reply = await self.brokers.at(url).announce_successors(
                    ns, name, parent, _successors(operation, parent, urls)
                )
            except AdminError as exc:
                log.info("%s/%s: successors of #%d not announced: %s", ns, name, parent, exc)
                return
            log.info(
                "%s/%s: %s %s: successors of #%d named to %s producer(s) ahead of the seal",
                ns,
                name,
                operation.kind,
                operation.id,
                parent,
                reply.get("producersTold"),
            )

        await asyncio.gather(*(announce(p) for p in operation.parents))

    async def _seal_parents(self, topic: JsonObj, operation: Operation) -> set[int]:
        """Terminate every parent (concurrently: the producers' window is the slowest seal).
        Returns the children their parent's broker opened with the seal: a split's children
        placed beside their parent (``choose_broker``), whose producers then wait for no
        controller step."""
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        urls = self.cache.segment_brokers(ns, name)
        seals = []
        for parent in operation.parents:
            successors = _successors(operation, parent, urls)
            url = urls.get(parent)
            if not url:
                raise broker_unavailable(f"segment {parent} has no broker recorded")
            # A split's children beside their parent are opened by its broker as the seal
            # completes; the activation step after this finds them open.
            beside = [
                c.segment_id
                for c in operation.children
                if c.parent_ids == (parent,) and urls.get(c.segment_id) == url
            ]
            seals.append(
                self.brokers.at(url).terminate(ns, name, parent, successors, open_after=beside)
            )
        replies = await _all(seals)
        return {int(sid) for reply in replies for sid in reply.get("opened") or []}

    async def _activate_children(
        self, topic: JsonObj, operation: Operation, *, opened: AbstractSet[int] = frozenset()
    ) -> None:
        """Open the children for produce: every parent is sealed by now (idempotent). Those in
        ``opened`` (by their parent's seal) are open already."""
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        urls = self.cache.segment_brokers(ns, name)
        activations = []
        for child in operation.children:
            if child.segment_id in opened:
                continue
            url = urls.get(child.segment_id)
            if not url:
                raise broker_unavailable(f"segment {child.segment_id} has no broker recorded")
            activations.append(self.brokers.at(url).activate(ns, name, child.segment_id))
        await _all(activations)

    async def _change(self, topic: JsonObj, change: TypedChange, *, fresh: bool = False) -> JsonObj:
        """Apply a ``core.topicstatus`` change with CAS (``fresh``: try ``topic`` first, else
        read it); a :class:`StatusConflict` it raises rejects the operation."""
        meta = topic["metadata"]
        try:
            return await change_topic_status(
                self.kube, meta["namespace"], meta["name"], change, topic=topic if fresh else None
            )
        except StatusConflict as exc:
            raise OperationRejected(str(exc)) from None

    async def _record_phase(self, topic: JsonObj, operation: Operation) -> JsonObj:
        return await self._change(topic, lambda status, _: record_phase(status, operation))

    async def _commit(self, topic: JsonObj, operation: Operation) -> JsonObj:
        now = self.clock()
        message = _describe(operation)
        return await self._change(
            topic, lambda status, _: commit_operation(status, operation, now, message)
        )

    async def _finish(self, topic: JsonObj, operation: Operation) -> None:
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        now = format_time(self.clock())
        for parent in operation.parents:
            updated = await self.kube.patch_segment_status(
                ns, segment_name(name, parent), {"state": "Sealed", "sealedAt": now}
            )
            self.cache.put_segment(updated)
        for child in operation.children:
            updated = await self.kube.patch_segment_status(
                ns, segment_name(name, child.segment_id), {"state": "Active"}
            )
            self.cache.put_segment(updated)
        self.cache.put_topic(topic)
        layout = layout_of(topic)
        if layout is not None and self.on_layout is not None:
            self.on_layout(ns, name, layout)
        reason = {"split": "Split", "merge": "Merged", "rebucket": "Rebucketed"}[operation.kind]
        await self.events(
            topic,
            "Normal",
            reason,
            f"{_describe(operation)} ({operation.source}: {operation.reason})",
        )

    async def _any_parent_sealed(self, topic: JsonObj, operation: Operation) -> bool:
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        urls = self.cache.segment_brokers(ns, name)
        for parent in operation.parents:
            url = urls.get(parent)
            if not url:
                continue
            stats = await self.brokers.at(url).find_stats(ns, name, parent)
            if stats and stats.get("sealed"):
                return True
        return False

    async def roll_back(self, topic: JsonObj, operation: Operation, why: str) -> JsonObj:
        """Undo a not-yet-sealed operation: drop the children everywhere, clear the intent."""
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        segments = self.cache.segments.get((ns, name), {})
        for child in operation.children:
            existing = segments.get(child.segment_id)
            url = self.cache.broker_url_of(existing) if existing is not None else ""
            if url:
                await self.brokers.at(url).delete_segment(ns, name, child.segment_id)
            await self.kube.delete_segment(ns, segment_name(name, child.segment_id))
        now = self.clock()
        topic = await self._change(
            topic, lambda status, _: roll_back_operation(status, operation, why, now)
        )
        metrics.OPERATIONS.labels(
            ns, name, operation.kind.value, operation.source, "rolled-back"
        ).inc()
        await self.events(
            topic, "Warning", "OperationRolledBack", f"{_describe(operation)} rolled back: {why}"
        )
        return topic


def _successors(operation: Operation, parent: int, urls: Mapping[int, str]) -> list[Successor]:
    """The children of ``parent`` as its broker tells them to producers."""
    return [
        Successor(c.segment_id, c.hash_range.start, c.hash_range.end, urls.get(c.segment_id, ""))
        for c in operation.children
        if parent in c.parent_ids
    ]


async def _all(calls: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Await every call, then raise the first failure (each call is idempotent, so a retry
    repeats the ones that succeeded harmlessly); the results in order."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return cast(list[T], results)


def _describe(operation: Operation) -> str:
    parents = ", ".join(f"#{p}" for p in operation.parents)
    children = ", ".join(f"#{c.segment_id} {c.hash_range.hex()}" for c in operation.children)
    verb = {"split": "split", "merge": "merged", "rebucket": "rebucketed"}[operation.kind]
    return f"{verb} {parents} into {children}"

"""Level-based reconciliation of one ScalableTopic by the leader of its shard (docs/operator.md).

Each pass reads the topic fresh, compares what should be with what is, does what is missing,
and writes the status only when it changed. Everything it does is idempotent, so a pass can be
interrupted anywhere (crash, lost Lease) and simply run again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..brokeradmin import AdminError
from ..core.buckets import initial_layout_buckets, layout_buckets
from ..core.jsontypes import JsonObj
from ..core.layout import SegmentInfo, SegmentLayout
from ..core.operation import Operation, plan_merge, plan_rebucket, plan_split
from ..core.policy import (
    AutoScalePolicy,
    ClusterDefaults,
    PolicyError,
    Resolution,
    format_duration,
    resolve_policy,
)
from ..core.rebuild import (
    one_report_each,
    orphans,
    rebuild_layout,
    record_from_segment,
    request_after_rebuild,
    subscription_entries,
)
from ..core.resources import (
    ANNOTATION_AUTOSCALE_POLICY,
    ANNOTATION_REQUEST,
    ConditionType,
    ControllerRef,
    LastRequest,
    Reason,
    ResourceValidationError,
    ScalableTopicSpec,
    ScalableTopicStatus,
    format_time,
    parse_manual_request,
    parse_time,
    parse_topic_spec,
    segment_name,
    topic_name_problem,
)
from ..core.retention import RetentionRule, SegmentDrains, drains_from_stats, next_expiry, prunable
from ..core.topicstatus import (
    find_handled,
    layout_from,
    not_ready,
    read_status,
    reconciled,
    reject_request,
    remember_request,
    report_handled,
    with_layout,
    with_policy,
)
from . import metrics
from .brokers import BrokerAdmin
from .cache import TopicCache, layout_of, recorded_broker
from .corruption import corrupted_segments
from .kube import KubeApi
from .protocol import NoBrokerAvailable, OperationExecutor, OperationRejected
from .restore import (
    BrokersUnanswered,
    adopt,
    broker_reports,
    record_epoch,
    write_missing_segments,
)
from .status import TopicGone, change_topic_status, put_layout, update_topic_status
from .transfer import MoveRejected, TransferExecutor

log = logging.getLogger(__name__)

FINALIZER = "scalabletopics.io/finalizer"
POLICY_ANNOTATION = ANNOTATION_AUTOSCALE_POLICY

Key = tuple[str, str]


STATS_CONCURRENCY = 8
"""Broker stats calls one reconcile pass makes at once (drain and retention checks)."""


class SegmentsUnavailable(Exception):
    def __init__(self, segments: list[int], detail: str) -> None:
        super().__init__(f"segments {segments} are not on a broker yet: {detail}")
        self.segments = segments


@dataclass(frozen=True)
class _Observed:
    """The last broker stats of a sealed segment: ``round`` is the stats round they were read
    in, ``drains`` is ``None`` when the broker could not say (unreachable, or no such segment).
    A sealed segment's drains only grow, so a fully drained observation is kept for good."""

    round: int
    drains: SegmentDrains | None


class TopicReconciler:
    def __init__(
        self,
        kube: KubeApi,
        brokers: BrokerAdmin,
        cache: TopicCache,
        executor: OperationExecutor,
        *,
        leads: Callable[[str, str], bool],
        controller_ref: Callable[[str, str], dict[str, Any]],
        defaults: AutoScalePolicy,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.brokers = brokers
        self.cache = cache
        self.executor = executor
        self.leads = leads
        self.controller_ref = controller_ref
        self.defaults = defaults
        self.clock = clock
        self.policies: dict[Key, AutoScalePolicy] = {}
        self.resolutions: dict[Key, Resolution] = {}
        """The effective policy of each topic with every knob's source (``status.autoScale``)."""
        self.cluster = ClusterDefaults()
        """The cluster-wide level (the ConfigMap the operator watches, ``clusterdefaults``)."""
        self._policy_state: dict[Key, tuple[Resolution | None, str | None]] = {}
        """This pass's resolution and policy problem, for ``status.autoScale``."""
        self._locks: dict[Key, asyncio.Lock] = {}
        self.on_deleted: Callable[[str, str], None] | None = None
        self.on_reconciled: Callable[[str, str, JsonObj], None] | None = None
        self.on_drained: Callable[[str, str, str, int], None] | None = None
        """Called with (namespace, topic, subscription, segment id) for a drain seen in broker
        stats: the consumer hub's ``segment_drained``."""
        self.on_requeue_after: Callable[[Key, float], None] | None = None
        """Asks for another pass of a topic in that many seconds (a retention deadline)."""
        self.stats_round = 0
        self._observed: dict[Key, dict[int, _Observed]] = {}
        self._leftovers: dict[Key, list[int]] = {}
        self._unknown: dict[Key, tuple[int, ...]] = {}
        """Segments outside the layout that it never handed out (kept), as last logged."""
        self.transfers = TransferExecutor(
            kube, brokers, cache, events=self.event, requeue=lambda: self.on_requeue_after
        )

    def new_stats_round(self) -> None:
        """Start a stats round (the resync loop calls it once per resync interval): a sealed
        segment's broker is asked for its stats at most once per round."""
        self.stats_round += 1

    def forget(self, namespace: str, name: str) -> None:
        metrics.forget_topic(namespace, name)
        self._observed.pop((namespace, name), None)
        self._leftovers.pop((namespace, name), None)
        self._unknown.pop((namespace, name), None)
        self._policy_state.pop((namespace, name), None)
        self.resolutions.pop((namespace, name), None)

    def lock(self, key: Key) -> asyncio.Lock:
        """Held by whoever mutates the topic (a reconcile pass or an auto-scale operation)."""
        return self._locks.setdefault(key, asyncio.Lock())

    async def event(self, topic: JsonObj, type_: str, reason: str, message: str) -> None:
        await self.kube.post_event(
            topic, type_=type_, reason=reason, message=message, component="scalable-topics-operator"
        )

    async def namespace_policy(self, namespace: str) -> str | None:
        """The text of the namespace's policy annotation (``None`` without one)."""
        annotations = await self.kube.namespace_annotations(namespace)
        return annotations.get(POLICY_ANNOTATION)

    def resolve(
        self, spec: ScalableTopicSpec, namespace_policy: str | None
    ) -> tuple[Resolution | None, tuple[str, str] | None]:
        """The topic's effective policy (``core.policy.resolve_policy``) and the problem to show
        in Ready: an ignored namespace annotation (the other levels apply) or an invalid
        combination (no auto-scaling until it is fixed)."""
        knobs = spec.auto_scale.knobs() if spec.auto_scale is not None else None
        try:
            resolution = resolve_policy(knobs, namespace_policy, self.cluster, self.defaults)
        except PolicyError as exc:
            return None, (
                Reason.INVALID_AUTO_SCALE_POLICY,
                f"invalid effective auto-scale policy: {exc}; auto-scaling is stopped",
            )
        if resolution.problems:
            return resolution, (Reason.INVALID_AUTO_SCALE_POLICY, "; ".join(resolution.problems))
        return resolution, None

    # -- the pass ------------------------------------------------------------------------------

    async def reconcile(self, key: Key) -> None:
        namespace, name = key
        if not self.leads(namespace, name):
            return
        started = time.perf_counter()
        try:
            async with self.lock(key):
                await self._reconcile(namespace, name)
            metrics.RECONCILES.labels("ok").inc()
        except TopicGone:
            self.cache.drop_topic(namespace, name)
            self.forget(namespace, name)
            metrics.RECONCILES.labels("gone").inc()
        except Exception:
            metrics.RECONCILES.labels("error").inc()
            raise
        finally:
            metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)

    async def _reconcile(self, namespace: str, name: str) -> None:
        topic = await self.kube.get_topic(namespace, name)
        if topic is None:
            self.cache.drop_topic(namespace, name)
            self.forget(namespace, name)
            if self.on_deleted:
                self.on_deleted(namespace, name)
            return
        meta = topic["metadata"]
        if meta.get("deletionTimestamp"):
            await self._finalize(topic)
            return
        name_problem = topic_name_problem(name)
        if name_problem is not None:
            # Stored before the CRD limited names: no Segment can carry the name as its label,
            # so nothing is created (not even the finalizer) and nothing is retried.
            await self._not_ready(
                topic, Reason.NAME_TOO_LONG, name_problem, stalled=True, unbuilt=True
            )
            return
        if FINALIZER not in (meta.get("finalizers") or []):
            topic = await self.kube.patch_topic(
                namespace,
                name,
                {
                    "metadata": {
                        "finalizers": [*(meta.get("finalizers") or []), FINALIZER],
                        "resourceVersion": meta["resourceVersion"],
                    }
                },
            )

        try:
            spec = parse_topic_spec(topic.get("spec"))
        except ResourceValidationError as exc:
            await self._not_ready(topic, Reason.INVALID_SPEC, str(exc), stalled=True)
            return
        # An invalid policy stops nothing but auto-scaling: an operation in flight must still be
        # finished (a sealed parent waits for its layout commit), segments kept in place and
        # manual requests served. Ready=False says what is wrong.
        # The policy is the topic spec's, then the namespace annotation's, then the cluster
        # ConfigMap's, then the defaults.
        namespace_policy = await self.namespace_policy(namespace)
        resolution, problem = self.resolve(spec, namespace_policy)
        self._policy_state[(namespace, name)] = (resolution, problem[1] if problem else None)

        layout = layout_of(topic)
        raw_layout = (topic.get("status") or {}).get("layout")
        if layout is None and raw_layout:
            # Never act on a layout that does not read: the Segments (and their brokers' data)
            # not in some stand-in layout would be deleted. A person has to look.
            try:
                SegmentLayout.from_metadata(raw_layout)
                problem_text = "status.layout is not a PIP-468 layout"
            except (ValueError, TypeError, AttributeError) as exc:
                problem_text = f"status.layout: {exc}"
            await self._not_ready(topic, Reason.LAYOUT_INVALID, problem_text, stalled=True)
            return
        fresh = False
        if layout is None:
            # Without a layout, Segments or broker data mean a lost status, never a new topic.
            restored = await self._rebuild(topic, spec)
            if restored is None:
                return
            topic, layout = restored
            fresh = layout is None
        if layout is None:
            # Nothing of the topic exists anywhere (``_rebuild`` looked), so nothing built is
            # stopped: ``initialSegments`` outside a bound that the namespace or the defaults
            # set (admission rejects the topic's own). An invalid policy says so itself.
            unbuildable = None if resolution is None else spec.initial_segments_problem(resolution)
            if unbuildable is not None:
                await self._not_ready(
                    topic, Reason.INVALID_SPEC, unbuildable, stalled=True, unbuilt=True
                )
                return
            topic, layout = await self._initialize(topic, spec)

        if (topic.get("status") or {}).get("operation"):
            topic = await self.executor.resume(topic)
            layout = layout_of(topic) or layout
        topic = await self.transfers.resume(topic)
        topic = await self.transfers.drain(topic)
        topic = await self.transfers.shed(topic)

        try:
            await self._ensure_segments(topic, layout, spec, recover=not fresh)
        except (NoBrokerAvailable, SegmentsUnavailable) as exc:
            await self._not_ready(topic, Reason.BROKERS_UNAVAILABLE, str(exc))
            raise

        topic = await self._manual_request(topic, layout)
        layout = layout_of(topic) or layout
        topic, layout, look_again = await self._retain(topic, layout, spec)
        problem = corrupted_segments(self.cache.segments.get((namespace, name), {}).values()) or (
            problem
        )
        previous = read_status(topic.get("status")).condition(ConditionType.READY)
        topic = await self._write_status(topic, layout, problem)
        metrics.observe_layout(namespace, name, layout_of(topic) or layout)
        if problem and (
            not previous or previous.reason != problem[0] or previous.message != problem[1]
        ):
            await self.event(topic, "Warning", problem[0], problem[1])
        self.cache.put_topic(topic)
        if resolution is None:
            self.policies.pop((namespace, name), None)
            self.resolutions.pop((namespace, name), None)
        else:
            self.policies[(namespace, name)] = resolution.policy
            self.resolutions[(namespace, name)] = resolution
        if self.on_reconciled:
            self.on_reconciled(namespace, name, topic)
        if look_again is not None and self.on_requeue_after is not None:
            self.on_requeue_after((namespace, name), look_again)

    # -- pieces --------------------------------------------------------------------------------

    async def _rebuild(
        self, topic: JsonObj, spec: ScalableTopicSpec
    ) -> tuple[JsonObj, SegmentLayout | None] | None:
        """A topic without ``status.layout``: rebuild it from the Segment resources and what the
        brokers hold (``core.rebuild``; docs/operator.md, "Lost status").

        Returns ``(topic, None)`` when nothing of the topic exists anywhere (a new topic: the
        caller creates its first layout), ``(topic, layout)`` once the rebuilt layout is written,
        and ``None`` when the pass stops: the records do not make one DAG (Stalled, LayoutLost:
        a person has to look; nothing is deleted). Raises ``BrokersUnanswered`` (after saying
        so in the conditions) while a broker that may hold the topic's data does not answer.
        """
        meta = topic["metadata"]
        ns, name = meta["namespace"], meta["name"]
        bodies = await self.kube.list_segments(ns, name)
        for body in bodies:
            self.cache.put_segment(body)
        try:
            reports = await broker_reports(self.brokers, self.cache, ns, name, bodies)
        except BrokersUnanswered as exc:
            await self._not_ready(topic, Reason.BROKERS_UNAVAILABLE, str(exc))
            raise
        if not bodies and not reports:
            return topic, None
        try:
            rebuilt = rebuild_layout(
                [record_from_segment(b) for b in bodies],
                reports,
                operation_id=f"rebuilt-{uuid.uuid4().hex[:8]}",
                started_at=format_time(self.clock()),
            )
        except ValueError as exc:
            metrics.LAYOUT_REBUILDS.labels(ns, name, "failed").inc()
            message = (
                f"status.layout is gone and cannot be rebuilt from {len(bodies)} Segment(s) and "
                f"{len(reports)} segment(s) on brokers: {exc}. Nothing was deleted. Restore "
                "status.layout from a backup (the status subresource), or correct the records "
                "named here (a Segment resource, a segment on its broker) so that they make one "
                "DAG whose active segments cover the ring; the next pass rebuilds it then"
            )
            log.error("%s/%s: %s", ns, name, message)
            await self._not_ready(topic, Reason.LAYOUT_LOST, message, stalled=True)
            return None
        adopted = await adopt(self.kube, self.cache, topic, bodies)
        await write_missing_segments(
            self.kube, self.cache, topic, rebuilt.layout, rebuilt.from_brokers
        )
        layout = rebuilt.layout
        await record_epoch(self.kube, self.cache, bodies, layout.epoch)
        subscriptions = subscription_entries(
            layout, reports, {s.name: s.type.value for s in spec.subscriptions}
        )
        resumed: list[str] = []
        unrun: list[str] = []
        wrote: list[bool] = []

        def change(status: dict[str, Any], obj: JsonObj) -> None:
            resumed.clear()
            unrun.clear()
            wrote.clear()
            if status.get("layout"):
                return
            wrote.append(True)
            put_layout(status, layout)
            if not status.get("subscriptions"):
                # What the consumer hub restores from; without it a new leader would count
                # every sealed segment drained.
                status["subscriptions"] = subscriptions
            operation = rebuilt.operation
            if status.get("operation"):
                # The intent survived (only the layout went): rebased on the rebuilt epoch, the
                # resume decides on it as on any operation it finds.
                try:
                    found = Operation.from_status(status["operation"])
                    operation = replace(found, base_epoch=layout.epoch)
                except ValueError:
                    pass
            annotations = obj["metadata"].get("annotations") or {}
            operation, last = request_after_rebuild(
                annotations.get(ANNOTATION_REQUEST), operation, format_time(self.clock())
            )
            if operation is not None:
                status["operation"] = operation.to_status()
                resumed.append(operation.id)
            if last is not None and not status.get("lastRequest"):
                status["lastRequest"] = last
                unrun.append(str(last["id"]))

        topic = await update_topic_status(self.kube, ns, name, change, topic=topic)
        written = layout_of(topic)
        if not wrote:  # another writer's layout came first: the next pass looks at it
            return None if written is None else (topic, written)
        outcome = "from-brokers" if rebuilt.from_brokers else "from-segments"
        metrics.LAYOUT_REBUILDS.labels(ns, name, outcome).inc()
        parts = [f"{len(bodies)} Segment(s)"]
        if rebuilt.from_brokers:
            parts.append(f"segments {sorted(rebuilt.from_brokers)} from their brokers")
        if adopted:
            parts.append(f"{adopted} Segment(s) taken over from a previous uid of the topic")
        message = (
            f"status.layout was missing: rebuilt from {', '.join(parts)} at epoch {layout.epoch} "
            f"({len(layout.segments)} segment(s), {len(layout.active())} active)"
        )
        if resumed:
            message += f"; resuming the interrupted operation {resumed[0]}"
        if unrun:
            message += f"; request {unrun[0]} is not run again (whether it ran is unknown)"
        log.warning("%s/%s: %s", ns, name, message)
        await self.event(topic, "Warning", "LayoutRebuilt", message)
        return topic, written

    async def _initialize(
        self, topic: JsonObj, spec: ScalableTopicSpec
    ) -> tuple[JsonObj, SegmentLayout]:
        layout = SegmentLayout.initial(spec.initial_segments)

        def change(status: ScalableTopicStatus, obj: JsonObj) -> ScalableTopicStatus:
            return status if status.layout else with_layout(status, layout)

        meta = topic["metadata"]
        topic = await change_topic_status(
            self.kube, meta["namespace"], meta["name"], change, topic=topic
        )
        await self.event(
            topic, "Normal", "Created", f"created {len(layout.active())} segment(s) at epoch 0"
        )
        return topic, layout_of(topic) or layout

    def _buckets(
        self, topic: JsonObj, layout: SegmentLayout, spec: ScalableTopicSpec
    ) -> dict[int, int]:
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        known = self.cache.segment_buckets(ns, name)
        roots = {s.segment_id for s in layout.segments.values() if not s.parent_ids}
        if not all(r in known for r in roots):
            initial = SegmentLayout.initial(spec.initial_segments)
            known = {**initial_layout_buckets(initial, spec.entry_buckets), **known}
        try:
            return layout_buckets(layout, known)
        except ValueError:
            return {sid: known.get(sid, 1) for sid in layout.segments}

    async def _ensure_segments(
        self,
        topic: JsonObj,
        layout: SegmentLayout,
        spec: ScalableTopicSpec,
        *,
        recover: bool = True,
    ) -> None:
        """Every segment of the layout exists where it should (Active on its broker, with the
        spec's subscriptions) or is marked Sealed; segments no longer in the DAG are deleted
        from their brokers and then as resources. A segment of the layout whose Segment is gone
        is looked for on the brokers first (``recover``; not for a topic just created, which has
        nothing anywhere), so that it is never placed afresh, empty, away from its data."""
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        subscriptions = sorted((s.name, s.type.value) for s in spec.subscriptions)
        wanted = {s for s, _ in subscriptions}
        looked: set[int] = set()
        """Segments this pass already looked for on the brokers (not placed afresh again)."""
        if any(sid not in self._segments_of(ns, name) for sid in layout.segments):
            for body in await self.kube.list_segments(ns, name):
                self.cache.put_segment(body)
            existing = self._segments_of(ns, name)
            missing = [sid for sid in sorted(layout.segments) if sid not in existing]
            if missing and recover:
                await self._recover_segments(topic, layout, missing)
            looked.update(missing)
        # After the listing: once roots were pruned, bucket counts come from the Segments.
        buckets = self._buckets(topic, layout, spec)
        pending: list[int] = []
        failures: list[str] = []
        for info in layout.segments.values():
            # The cache as it is now, not as listed: the watch drops a Segment deleted while
            # this pass awaited (after the listing saw it), and that one is looked for on the
            # brokers first too, never placed afresh (empty, perhaps elsewhere).
            seg = self._segments_of(ns, name).get(info.segment_id)
            if seg is None and recover and info.segment_id not in looked:
                looked.add(info.segment_id)
                await self._recover_segments(topic, layout, [info.segment_id])
                seg = self._segments_of(ns, name).get(info.segment_id)
            if seg is None and recover and info.active:
                log.warning(
                    "%s/%s: segment %d of the layout has no Segment and no broker holds it: "
                    "placing it afresh",
                    ns,
                    name,
                    info.segment_id,
                )
            status = (seg or {}).get("status") or {}
            state = status.get("state")
            recorded = status.get("broker") or {}
            pod = self.cache.brokers.get(str(recorded.get("pod")))
            # Unknown pod, or its URL moved (a re-created pod may get a new IP): re-record it.
            broker_current = pod is not None and pod.url == recorded.get("url")
            if info.active:
                if seg is None or state != "Active" or not broker_current:
                    try:
                        await self.executor.ensure_segment(
                            topic,
                            info.segment_id,
                            info.hash_range,
                            list(info.parent_ids),
                            buckets.get(info.segment_id, 1),
                            subscriptions,
                            state="Active",
                        )
                    except AdminError as exc:
                        pending.append(info.segment_id)
                        failures.append(str(exc))
                        continue
                elif set(status.get("subscriptions") or []) != wanted:
                    await self._sync_subscriptions(topic, info.segment_id, status, subscriptions)
            elif seg is not None and state != "Sealed":
                updated = await self.kube.patch_segment_status(
                    ns,
                    segment_name(name, info.segment_id),
                    {"state": "Sealed", "sealedAt": format_time(self.clock())},
                )
                self.cache.put_segment(updated)
            current = self.cache.segments.get((ns, name), {}).get(info.segment_id)
            if current is not None:
                await self._record_epochs(ns, name, info, current)
        if failures:
            raise SegmentsUnavailable(pending, "; ".join(failures))
        await self._remove_orphans(topic, layout)

    def _segments_of(self, ns: str, name: str) -> Mapping[int, JsonObj]:
        return self.cache.segments.get((ns, name), {})

    async def _recover_segments(
        self, topic: JsonObj, layout: SegmentLayout, missing: list[int]
    ) -> None:
        """Write the Segment of each segment in ``missing`` that a broker still holds, naming
        that broker. Raises ``SegmentsUnavailable`` while a broker does not answer (it may hold
        one of them) or when two brokers hold the same segment."""
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        segments = list(self.cache.segments.get((ns, name), {}).values())
        try:
            reports = await broker_reports(self.brokers, self.cache, ns, name, segments)
        except BrokersUnanswered as exc:
            raise SegmentsUnavailable(missing, str(exc)) from None
        problems: list[str] = []
        found = one_report_each((r for r in reports if r.segment_id in missing), problems)
        if problems:
            raise SegmentsUnavailable(
                missing, "; ".join(problems) + ": delete the copy that is not wanted"
            )
        if not found:
            return
        await write_missing_segments(self.kube, self.cache, topic, layout, found)
        where = ", ".join(f"#{sid} on {r.pod}" for sid, r in sorted(found.items()))
        await self.event(
            topic,
            "Warning",
            "SegmentsRecovered",
            f"Segments written again from their brokers: {where}",
        )

    async def _record_epochs(self, ns: str, name: str, info: SegmentInfo, seg: JsonObj) -> None:
        """Keep the layout's epochs of the segment on its Segment: a lost layout is rebuilt from
        the Segments, with an epoch above every recorded one (``core.rebuild``)."""
        status = seg.get("status") or {}
        wanted = {
            "createdAtEpoch": info.created_at_epoch,
            "sealedAtEpoch": info.sealed_at_epoch or None,
        }
        if all(status.get(k) == v for k, v in wanted.items()):
            return
        updated = await self.kube.patch_segment_status(
            ns, segment_name(name, info.segment_id), wanted
        )
        self.cache.put_segment(updated)

    async def _remove_orphans(self, topic: JsonObj, layout: SegmentLayout) -> None:
        """Delete the segments the DAG had and pruned (``core.rebuild.orphans``: an id below
        ``nextSegmentId`` that is no longer in the layout): on their broker first, then the
        Segment resource, which is the record of where the data lives until the broker has let
        go of it. A segment whose broker pod is away is kept (``Reconciling`` says so) and
        retried on a later pass. Children of an operation in flight are not in the DAG yet and
        are left alone; so is every segment the layout never handed out (a layout that is
        missing, fresh or rebuilt never makes anything an orphan to delete)."""
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        operation = (topic.get("status") or {}).get("operation") or {}
        in_flight = {int(c["id"]) for c in operation.get("children") or [] if "id" in c}
        segments = self.cache.segments.get((ns, name), {})
        verdict = orphans(layout, segments, in_flight)
        if verdict.keep and self._unknown.get((ns, name)) != verdict.keep:
            log.warning(
                "%s/%s: segments %s are not in the layout and its nextSegmentId %d never handed "
                "them out: kept with their data, not deleted",
                ns,
                name,
                list(verdict.keep),
                layout.next_segment_id,
            )
        self._unknown[(ns, name)] = verdict.keep
        leftovers: list[int] = []
        for sid in verdict.remove:
            seg = segments[sid]
            url = self.cache.broker_url_of(seg)
            if recorded_broker(seg) and not url:
                leftovers.append(sid)
                continue
            if url:
                try:
                    await self.brokers.at(url).delete_segment(ns, name, sid)
                except AdminError as exc:
                    log.warning(
                        "%s/%s: segment %d not deleted from its broker: %s", ns, name, sid, exc
                    )
                    leftovers.append(sid)
                    continue
            await self.kube.delete_segment(ns, segment_name(name, sid))
            self.cache.drop_segment(seg)
        if leftovers:
            self._leftovers[(ns, name)] = leftovers
        else:
            self._leftovers.pop((ns, name), None)

    async def _sync_subscriptions(
        self,
        topic: JsonObj,
        segment_id: int,
        status: Mapping[str, Any],
        subscriptions: list[tuple[str, str]],
    ) -> None:
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        url = (status.get("broker") or {}).get("url")
        if not url:
            return
        have = set(status.get("subscriptions") or [])
        wanted = dict(subscriptions)
        for sub, type_ in subscriptions:
            if sub not in have:
                await self.brokers.at(url).create_subscription(ns, name, segment_id, sub, type_)
        for sub in have - set(wanted):
            await self.brokers.at(url).delete_subscription(ns, name, segment_id, sub)
        updated = await self.kube.patch_segment_status(
            ns, segment_name(name, segment_id), {"subscriptions": sorted(wanted)}
        )
        self.cache.put_segment(updated)

    # -- retention and controller-observed drains ---------------------------------------------

    async def _retain(
        self, topic: JsonObj, layout: SegmentLayout, spec: ScalableTopicSpec
    ) -> tuple[JsonObj, SegmentLayout, float | None]:
        """Feed drains seen in broker stats to the consumer hub, and prune the sealed segments
        retention lets go (``core.retention``; docs/operator.md, "Retention and drains").

        Returns the topic, its layout and, when a segment reaches its retention time later, in
        how many seconds to look again. Broker stats are read only for sealed segments not known
        to be fully drained, only when a subscription still waits for the drain or the
        retention time has passed, and at most once per stats round (``new_stats_round``).
        """
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        key = (ns, name)
        observed = self._observed.setdefault(key, {})
        for sid in [s for s in observed if s not in layout.segments]:
            del observed[sid]
        sealed = sorted(
            (s for s in layout.segments.values() if not s.active),
            key=lambda s: (s.created_at_epoch, s.segment_id),
        )
        status = topic.get("status") or {}
        if not sealed or status.get("operation"):
            return topic, layout, None
        retention = spec.retention.rule() if spec.retention is not None else None
        now = self.clock()
        waiting = _hub_drained(status, spec)
        sealed_at = self._sealed_at(key, sealed)
        check = self._to_check(key, layout, sealed, sealed_at, waiting, retention, now)
        if check:
            await self._check(topic, check, set(waiting))
            sealed_at = self._sealed_at(key, sealed)
        if self.on_drained is not None:
            for info in sealed:
                seen = observed.get(info.segment_id)
                if seen is None or seen.drains is None:
                    continue
                for sub, done in waiting.items():
                    if sub in seen.drains.drained and info.segment_id not in done:
                        self.on_drained(ns, name, sub, info.segment_id)
        drained = {
            sid for sid, o in observed.items() if o.drains is not None and o.drains.fully_drained
        }
        sizes = {sid: o.drains.size for sid, o in observed.items() if o.drains is not None}
        if prunable(layout, sealed_at, drained, retention, now, sizes):
            topic, layout = await self._prune(topic, layout, sealed_at, drained, retention, sizes)
        deadline = next_expiry(layout, sealed_at, retention, now)
        return topic, layout, None if deadline is None else deadline - now + 0.1

    def _sealed_at(self, key: Key, sealed: list[SegmentInfo]) -> dict[int, float]:
        """When each sealed segment was sealed: its Segment's ``status.sealedAt`` (written by the
        leader once the layout that seals it is committed, so never early), else the seal time
        its broker reported."""
        segments = self.cache.segments.get(key, {})
        observed = self._observed.get(key, {})
        found: dict[int, float] = {}
        for info in sealed:
            raw = ((segments.get(info.segment_id) or {}).get("status") or {}).get("sealedAt")
            try:
                found[info.segment_id] = parse_time(str(raw))
                continue
            except ValueError:
                pass
            seen = observed.get(info.segment_id)
            if seen is not None and seen.drains is not None and seen.drains.sealed_at is not None:
                found[info.segment_id] = seen.drains.sealed_at
        return found

    def _to_check(
        self,
        key: Key,
        layout: SegmentLayout,
        sealed: list[SegmentInfo],
        sealed_at: Mapping[int, float],
        waiting: Mapping[str, set[int]],
        retention: RetentionRule | None,
        now: float,
    ) -> list[int]:
        """The sealed segments (``sealed`` is parents first) whose broker is asked for stats in
        this pass: not known to be fully drained, not asked yet in this stats round, and either a
        subscription still waits for its drain, or retention may prune it once it is
        drained (its time has passed or a size limit is set, and no parent stays behind)."""
        observed = self._observed.get(key, {})
        settled = {
            sid for sid, o in observed.items() if o.drains is not None and o.drains.fully_drained
        }
        chosen: list[int] = []
        for info in sealed:
            sid = info.segment_id
            seen = observed.get(sid)
            if sid in settled or (seen is not None and seen.round >= self.stats_round):
                continue
            known = seen.drains.drained if seen is not None and seen.drains is not None else ()
            feed = any(sid not in done and sub not in known for sub, done in waiting.items())
            due = retention is not None and (
                retention.size is not None
                or (
                    retention.time is not None
                    and sid in sealed_at
                    and now >= sealed_at[sid] + retention.time
                )
            )
            parents_may_go = all(
                p not in layout.segments or p in settled or p in chosen for p in info.parent_ids
            )
            if feed or (due and parents_may_go):
                chosen.append(sid)
        return chosen

    async def _check(self, topic: JsonObj, segment_ids: list[int], streams: set[str]) -> None:
        """Read the stats of ``segment_ids`` from their brokers (a few at a time) and remember
        them for this round; a broker that cannot answer leaves what was known before."""
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        observed = self._observed.setdefault((ns, name), {})
        segments = self.cache.segments.get((ns, name), {})
        limit = asyncio.Semaphore(STATS_CONCURRENCY)

        async def one(sid: int) -> None:
            seg = segments.get(sid)
            url = self.cache.broker_url_of(seg) if seg is not None else ""
            previous = observed.get(sid)
            drains: SegmentDrains | None = None
            if not url:
                outcome = "no-broker"
            else:
                async with limit:
                    try:
                        stats = await self.brokers.at(url).find_stats(ns, name, sid)
                    except AdminError as exc:
                        log.info("%s/%s: stats of segment %d: %s", ns, name, sid, exc)
                        stats, outcome = None, "error"
                    else:
                        outcome = "ok" if stats else "missing"
                if stats:
                    drains = drains_from_stats(stats)
            metrics.DRAIN_CHECKS.labels(outcome).inc()
            before = previous.drains if previous is not None else None
            if drains is not None:
                new = (drains.drained & streams) - (before.drained if before else frozenset())
                if new:
                    metrics.OBSERVED_DRAINS.labels(ns, name).inc(len(new))
            observed[sid] = _Observed(self.stats_round, drains if drains is not None else before)

        await asyncio.gather(*(one(sid) for sid in segment_ids))

    async def _prune(
        self,
        topic: JsonObj,
        layout: SegmentLayout,
        sealed_at: Mapping[int, float],
        drained: set[int],
        retention: RetentionRule | None,
        sizes: Mapping[int, int],
    ) -> tuple[JsonObj, SegmentLayout]:
        """CAS the pruned layout (the decision is made again on the layout read for the write),
        then delete the pruned segments from their brokers and as resources."""
        meta = topic["metadata"]
        ns, name = meta["namespace"], meta["name"]
        now = self.clock()
        pruned: list[SegmentInfo] = []

        def change(status: ScalableTopicStatus, obj: JsonObj) -> ScalableTopicStatus:
            pruned.clear()
            current = layout_from(status)
            if status.operation is not None or current is None:
                return status
            new = current
            for sid in prunable(current, sealed_at, drained, retention, now, sizes):
                pruned.append(new.segments[sid])
                new = new.prune(sid)
            if not pruned:
                return status
            new.validate()
            return with_layout(status, new)

        topic = await change_topic_status(self.kube, ns, name, change, topic=topic)
        layout = layout_of(topic) or layout
        if not pruned:
            return topic, layout
        self.cache.put_topic(topic)
        metrics.PRUNED_SEGMENTS.labels(ns, name).inc(len(pruned))
        segments = ", ".join(f"#{s.segment_id} {s.hash_range.hex()}" for s in pruned)
        log.info("%s/%s: pruned %s at epoch %d", ns, name, segments, layout.epoch)
        await self.event(
            topic,
            "Normal",
            "Pruned",
            f"pruned {segments} from the DAG (epoch {layout.epoch}): sealed, drained by every "
            f"subscription, {_describe_retention(retention)}",
        )
        await self._remove_orphans(topic, layout)
        return topic, layout

    async def _manual_request(self, topic: JsonObj, layout: SegmentLayout) -> JsonObj:
        annotations = topic["metadata"].get("annotations") or {}
        raw = annotations.get(ANNOTATION_REQUEST)
        if not raw:
            return topic
        status = read_status(topic.get("status"))
        last_id = status.last_request.id if status.last_request is not None else None
        try:
            request = parse_manual_request(raw)
        except ResourceValidationError as exc:
            request_id, op = loose_request(raw)
            if last_id == request_id:
                return topic
            return await self._reject(topic, request_id, op, str(exc))
        if last_id == request.id:
            return topic
        if (topic.get("status") or {}).get("operation"):
            return topic
        handled = find_handled(status, request.id)
        if handled is not None:
            return await self._already_handled(topic, handled)
        # The outcome of this request will replace lastRequest (the protocol's commit writes
        # only that): the previous one goes into the history first.
        meta = topic["metadata"]
        topic = await change_topic_status(
            self.kube,
            meta["namespace"],
            meta["name"],
            lambda status, _: remember_request(status),
            topic=topic,
        )
        op = request.op.value
        if op == "move":
            try:
                return await self.transfers.start(topic, request)
            except MoveRejected as exc:
                return await self._reject(topic, request.id, op, str(exc))
        try:
            operation = self.plan(
                topic,
                layout,
                op,
                request.segments,
                request.at,
                source="manual",
                reason=f"request {request.id}",
                request_id=request.id,
            )
        except ValueError as exc:
            return await self._reject(topic, request.id, op, str(exc))
        try:
            return await self.executor.start(topic, operation)
        except OperationRejected as exc:
            return await self._reject(topic, request.id, op, str(exc))

    def plan(
        self,
        topic: JsonObj,
        layout: SegmentLayout,
        op: str,
        segments: list[int],
        at: int | None,
        *,
        source: str,
        reason: str,
        request_id: str | None = None,
        buckets: int | None = None,
    ) -> Operation:
        """Plan a split/merge on the current layout; ``ValueError`` says why it can't be."""
        spec = parse_topic_spec(topic.get("spec"))
        counts = self._buckets(topic, layout, spec)
        op_id = f"{op}-{uuid.uuid4().hex[:8]}"
        fields: dict[str, Any] = {
            "source": source,
            "reason": reason,
            "request_id": request_id,
            "started_at": format_time(self.clock()),
        }
        if op == "split":
            if len(segments) != 1:
                raise ValueError(f"a split names exactly one segment, got {segments}")
            return plan_split(
                op_id,
                layout,
                segments[0],
                parent_buckets=counts.get(segments[0], 1),
                at=at,
                **fields,
            )
        if op == "merge":
            return plan_merge(
                op_id,
                layout,
                segments,
                parent_buckets={s: counts.get(s, 1) for s in segments},
                **fields,
            )
        if op == "rebucket":
            return plan_rebucket(op_id, layout, segments, buckets=buckets or 1, **fields)
        raise ValueError(f"unknown operation {op!r}")

    async def _reject(self, topic: JsonObj, request_id: str, op: str, message: str) -> JsonObj:
        meta = topic["metadata"]
        now = self.clock()
        topic = await change_topic_status(
            self.kube,
            meta["namespace"],
            meta["name"],
            lambda status, _: reject_request(status, request_id, op, message, now),
            topic=topic,
        )
        await self.event(topic, "Warning", "RequestRejected", f"request {request_id}: {message}")
        return topic

    async def _already_handled(self, topic: JsonObj, handled: LastRequest) -> JsonObj:
        """A request id found in the history was applied again: it is not executed again, and
        ``lastRequest`` reports it with its original outcome (which also keeps later passes from
        reporting it twice)."""
        meta = topic["metadata"]
        topic = await change_topic_status(
            self.kube,
            meta["namespace"],
            meta["name"],
            lambda status, _: report_handled(status, handled),
            topic=topic,
        )
        when = handled.completed_at or "an unknown time"
        await self.event(
            topic,
            "Normal",
            "RequestAlreadyHandled",
            f"request {handled.id} was already handled ({handled.result.value} at {when}), "
            "not executed again",
        )
        return topic

    async def _not_ready(
        self,
        topic: JsonObj,
        reason: str,
        message: str,
        *,
        stalled: bool = False,
        unbuilt: bool = False,
    ) -> None:
        """Ready=False (and Stalled=True if ``stalled``) with ``reason``; a Warning event when
        it is news. ``unbuilt``: nothing exists for the topic, and the status says so (no
        layout, 0 active segments) whatever an earlier pass wrote."""
        meta = topic["metadata"]
        generation = meta.get("generation")
        previous = read_status(topic.get("status")).condition(ConditionType.READY)
        now = self.clock()
        topic = await change_topic_status(
            self.kube,
            meta["namespace"],
            meta["name"],
            lambda status, _: not_ready(
                status,
                reason,
                message,
                generation=generation,
                now=now,
                stalled=stalled,
                unbuilt=unbuilt,
            ),
            topic=topic,
        )
        if not previous or previous.reason != reason or previous.message != message:
            await self.event(topic, "Warning", reason, message)

    async def _write_status(
        self, topic: JsonObj, layout: SegmentLayout, problem: tuple[str, str] | None = None
    ) -> JsonObj:
        """The level-based status; ``problem`` (reason, message) is a spec error that needs a
        human: Ready=False and Stalled=True with it, everything else as usual."""
        meta = topic["metadata"]
        ns, name = meta["namespace"], meta["name"]
        generation = meta.get("generation")
        controller = ControllerRef.model_validate(self.controller_ref(ns, name))
        leftovers = self._leftovers.get((ns, name), [])
        policy = self._policy_state.get((ns, name))
        now = self.clock()

        def change(status: ScalableTopicStatus, obj: JsonObj) -> ScalableTopicStatus:
            status = reconciled(
                status,
                layout,
                generation=generation,
                now=now,
                controller=controller,
                leftovers=leftovers,
                problem=problem,
            )
            return status if policy is None else with_policy(status, *policy)

        return await change_topic_status(self.kube, ns, name, change, topic=topic)

    async def _finalize(self, topic: JsonObj) -> None:
        meta = topic["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if FINALIZER not in (meta.get("finalizers") or []):
            return
        self.forget(ns, name)
        # No Segment can exist for a name too long to be its label (nor be listed by it).
        segments = (
            await self.kube.list_segments(ns, name) if topic_name_problem(name) is None else []
        )
        for seg in segments:
            url = self.cache.broker_url_of(seg)
            sid = int(seg["spec"]["segmentId"])
            if url:
                await self.brokers.at(url).delete_segment(ns, name, sid)
            await self.kube.delete_segment(ns, seg["metadata"]["name"])
        await self.kube.patch_topic(
            ns,
            name,
            {
                "metadata": {
                    "finalizers": [f for f in meta.get("finalizers") or [] if f != FINALIZER],
                    "resourceVersion": meta["resourceVersion"],
                }
            },
        )
        self.cache.drop_topic(ns, name)
        metrics.forget_topic(ns, name)
        if self.on_deleted:
            self.on_deleted(ns, name)
        log.info("%s/%s: deleted %d segment(s) and released the finalizer", ns, name, len(segments))


def loose_request(raw: str) -> tuple[str, str]:
    """The id and op of a request annotation that failed validation, for its ``Rejected``
    outcome: what the request said where it can be read (a one-segment merge is recorded as a
    merge), ``"invalid"`` for an unreadable id and ``"split"`` for an unreadable op (the status
    schema knows only split and merge)."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return "invalid", "split"
    if not isinstance(data, dict):
        return "invalid", "split"
    op = data.get("op")
    return str(data.get("id", "invalid")), op if op in ("split", "merge") else "split"


def _hub_drained(status: Mapping[str, Any], spec: ScalableTopicSpec) -> dict[str, set[int]]:
    """Subscription of the spec → the sealed segments the consumer hub has recorded as drained
    (``status.subscriptions``; stream and queue subscriptions alike gate children on it). A
    subscription without an entry yet is left out: the hub decides for a new one itself."""
    names = {s.name for s in spec.subscriptions}
    found: dict[str, set[int]] = {}
    for entry in status.get("subscriptions") or []:
        if not isinstance(entry, Mapping) or entry.get("name") not in names:
            continue
        done = entry.get("drainedSegments") or []
        found[str(entry["name"])] = {int(i) for i in done if isinstance(i, int)}
    return found


def _describe_retention(retention: RetentionRule | None) -> str:
    if retention is None:
        return "no retention"
    parts = []
    if retention.time is not None:
        parts.append(f"retention time {format_duration(retention.time)} passed")
    if retention.size is not None:
        parts.append(f"retention size {retention.size} bytes")
    return " or ".join(parts)

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
from typing import Any

from ..core.buckets import initial_layout_buckets, layout_buckets
from ..core.dagview import render_dag
from ..core.layout import SegmentLayout
from ..core.operation import Operation, plan_merge, plan_rebucket, plan_split
from ..core.policy import AutoScalePolicy
from ..core.resources import (
    ANNOTATION_REQUEST,
    ConditionType,
    Reason,
    ResourceValidationError,
    ScalableTopicSpec,
    condition,
    format_time,
    get_condition,
    parse_manual_request,
    parse_topic_spec,
    segment_name,
    set_condition,
)
from . import metrics
from .brokers import BrokerAdmin, BrokerError
from .cache import TopicCache, layout_of
from .kube import Body, KubeApi
from .protocol import NoBrokerAvailable, OperationExecutor, OperationRejected
from .status import TopicGone, update_topic_status

log = logging.getLogger(__name__)

FINALIZER = "scalabletopics.io/finalizer"
POLICY_ANNOTATION = "scalabletopics.io/autoscale-policy"

Key = tuple[str, str]


class SegmentsUnavailable(Exception):
    def __init__(self, segments: list[int], detail: str) -> None:
        super().__init__(f"segments {segments} are not on a broker yet: {detail}")
        self.segments = segments


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
        self._locks: dict[Key, asyncio.Lock] = {}
        self.on_deleted: Callable[[str, str], None] | None = None
        self.on_reconciled: Callable[[str, str, Body], None] | None = None

    def lock(self, key: Key) -> asyncio.Lock:
        """Held by whoever mutates the topic (a reconcile pass or an auto-scale operation)."""
        return self._locks.setdefault(key, asyncio.Lock())

    async def event(self, topic: Body, type_: str, reason: str, message: str) -> None:
        await self.kube.post_event(
            topic, type_=type_, reason=reason, message=message, component="scalable-topics-operator"
        )

    async def policy(self, namespace: str, spec: ScalableTopicSpec) -> AutoScalePolicy:
        """Topic spec, then the namespace annotation, then the operator's defaults."""
        annotations = await self.kube.namespace_annotations(namespace)
        raw = annotations.get(POLICY_ANNOTATION)
        namespace_policy: dict[str, Any] = {}
        if raw:
            try:
                namespace_policy = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ValueError(f"namespace annotation {POLICY_ANNOTATION}: {exc}") from None
        return spec.policy(namespace_policy, self.defaults)

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
            if self.on_deleted:
                self.on_deleted(namespace, name)
            return
        meta = topic["metadata"]
        if meta.get("deletionTimestamp"):
            await self._finalize(topic)
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
        problem: tuple[str, str] | None = None
        try:
            policy: AutoScalePolicy | None = await self.policy(namespace, spec)
        except ValueError as exc:
            policy, problem = None, (Reason.INVALID_AUTO_SCALE_POLICY, str(exc))

        layout = layout_of(topic)
        if layout is None:
            topic, layout = await self._initialize(topic, spec)

        if (topic.get("status") or {}).get("operation"):
            topic = await self.executor.resume(topic)
            layout = layout_of(topic) or layout

        try:
            await self._ensure_segments(topic, layout, spec)
        except (NoBrokerAvailable, SegmentsUnavailable) as exc:
            await self._not_ready(topic, Reason.BROKERS_UNAVAILABLE, str(exc))
            raise

        topic = await self._manual_request(topic, layout)
        layout = layout_of(topic) or layout
        previous = get_condition((topic.get("status") or {}).get("conditions"), ConditionType.READY)
        topic = await self._write_status(topic, layout, problem)
        if problem and (
            not previous
            or previous.get("reason") != problem[0]
            or previous.get("message") != problem[1]
        ):
            await self.event(topic, "Warning", problem[0], problem[1])
        self.cache.put_topic(topic)
        if policy is None:
            self.policies.pop((namespace, name), None)
        else:
            self.policies[(namespace, name)] = policy
        if self.on_reconciled:
            self.on_reconciled(namespace, name, topic)

    # -- pieces --------------------------------------------------------------------------------

    async def _initialize(self, topic: Body, spec: ScalableTopicSpec) -> tuple[Body, SegmentLayout]:
        layout = SegmentLayout.initial(spec.initial_segments)

        def change(status: dict[str, Any], obj: Body) -> None:
            if (status or {}).get("layout"):
                return
            status["layout"] = layout.to_metadata()
            status["epoch"] = layout.epoch
            status["nextSegmentId"] = layout.next_segment_id
            status["activeSegments"] = len(layout.active())
            status["dag"] = render_dag(layout)

        meta = topic["metadata"]
        topic = await update_topic_status(
            self.kube, meta["namespace"], meta["name"], change, topic=topic
        )
        await self.event(
            topic, "Normal", "Created", f"created {len(layout.active())} segment(s) at epoch 0"
        )
        return topic, layout_of(topic) or layout

    def _buckets(
        self, topic: Body, layout: SegmentLayout, spec: ScalableTopicSpec
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
        self, topic: Body, layout: SegmentLayout, spec: ScalableTopicSpec
    ) -> None:
        """Every segment of the layout exists where it should (Active on its broker, with the
        spec's subscriptions) or is marked Sealed; Segments no longer in the DAG are deleted."""
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        subscriptions = sorted((s.name, s.type.value) for s in spec.subscriptions)
        wanted = {s for s, _ in subscriptions}
        buckets = self._buckets(topic, layout, spec)
        existing = self.cache.segments.get((ns, name), {})
        if len(existing) < len(layout.segments):
            for body in await self.kube.list_segments(ns, name):
                self.cache.put_segment(body)
            existing = self.cache.segments.get((ns, name), {})
        pending: list[int] = []
        failures: list[str] = []
        for info in layout.segments.values():
            seg = existing.get(info.segment_id)
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
                    except BrokerError as exc:
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
        if failures:
            raise SegmentsUnavailable(pending, "; ".join(failures))
        for sid in list(existing):
            if sid not in layout.segments:
                await self.kube.delete_segment(ns, segment_name(name, sid))

    async def _sync_subscriptions(
        self,
        topic: Body,
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
                await self.brokers.create_subscription(url, ns, name, segment_id, sub, type_)
        for sub in have - set(wanted):
            await self.brokers.delete_subscription(url, ns, name, segment_id, sub)
        updated = await self.kube.patch_segment_status(
            ns, segment_name(name, segment_id), {"subscriptions": sorted(wanted)}
        )
        self.cache.put_segment(updated)

    async def _manual_request(self, topic: Body, layout: SegmentLayout) -> Body:
        annotations = topic["metadata"].get("annotations") or {}
        raw = annotations.get(ANNOTATION_REQUEST)
        if not raw:
            return topic
        status = topic.get("status") or {}
        try:
            request = parse_manual_request(raw)
        except ResourceValidationError as exc:
            request_id = _loose_id(raw)
            if (status.get("lastRequest") or {}).get("id") == request_id:
                return topic
            return await self._reject(topic, request_id, "split", str(exc))
        if (status.get("lastRequest") or {}).get("id") == request.id:
            return topic
        if status.get("operation"):
            return topic
        op = request.op.value
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
        topic: Body,
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

    async def _reject(self, topic: Body, request_id: str, op: str, message: str) -> Body:
        meta = topic["metadata"]
        now = format_time(self.clock())

        def change(status: dict[str, Any], obj: Body) -> None:
            status["lastRequest"] = {
                "id": request_id,
                "op": op if op in ("split", "merge") else "split",
                "result": "Rejected",
                "message": message[:1024],
                "completedAt": now,
            }

        topic = await update_topic_status(
            self.kube, meta["namespace"], meta["name"], change, topic=topic
        )
        await self.event(topic, "Warning", "RequestRejected", f"request {request_id}: {message}")
        return topic

    async def _not_ready(
        self, topic: Body, reason: str, message: str, *, stalled: bool = False
    ) -> None:
        meta = topic["metadata"]
        generation = meta.get("generation")
        previous = get_condition((topic.get("status") or {}).get("conditions"), ConditionType.READY)

        def change(status: dict[str, Any], obj: Body) -> None:
            conditions = status.get("conditions") or []
            conditions = set_condition(
                conditions, condition(ConditionType.READY, False, reason, message, generation)
            )
            conditions = set_condition(
                conditions,
                condition(
                    ConditionType.STALLED,
                    stalled,
                    reason if stalled else Reason.IDLE,
                    message if stalled else "",
                    generation,
                ),
            )
            conditions = set_condition(
                conditions,
                condition(
                    ConditionType.RECONCILING,
                    not stalled,
                    Reason.CREATING if not stalled else Reason.IDLE,
                    "" if stalled else message,
                    generation,
                ),
            )
            status["conditions"] = conditions
            status["observedGeneration"] = generation

        topic = await update_topic_status(
            self.kube, meta["namespace"], meta["name"], change, topic=topic
        )
        if not previous or previous.get("reason") != reason or previous.get("message") != message:
            await self.event(topic, "Warning", reason, message)

    async def _write_status(
        self, topic: Body, layout: SegmentLayout, problem: tuple[str, str] | None = None
    ) -> Body:
        """The level-based status; ``problem`` (reason, message) is a spec error that needs a
        human: Ready=False and Stalled=True with it, everything else as usual."""
        meta = topic["metadata"]
        ns, name = meta["namespace"], meta["name"]
        generation = meta.get("generation")
        controller = self.controller_ref(ns, name)
        operation = (topic.get("status") or {}).get("operation")
        if operation:
            reconciling = (
                True,
                {
                    "split": Reason.SPLITTING,
                    "merge": Reason.MERGING,
                    "rebucket": Reason.REBUCKETING,
                }[operation["kind"]],
                f"{operation['kind']} {operation['id']} at phase {operation['phase']}",
            )
        else:
            reconciling = (False, Reason.IDLE, "")
        active = layout.active()
        ready = problem is None
        ready_message = f"{len(active)} active segment(s) at epoch {layout.epoch}"
        ready_reason: str = Reason.RECONCILED
        stalled = (False, Reason.IDLE, "")
        if problem is not None:
            ready_reason, ready_message = problem
            stalled = (True, problem[0], problem[1])

        def change(status: dict[str, Any], obj: Body) -> None:
            conditions = status.get("conditions") or []
            conditions = set_condition(
                conditions,
                condition(ConditionType.READY, ready, ready_reason, ready_message, generation),
            )
            conditions = set_condition(
                conditions,
                condition(
                    ConditionType.RECONCILING,
                    reconciling[0],
                    reconciling[1],
                    reconciling[2],
                    generation,
                ),
            )
            conditions = set_condition(
                conditions, condition(ConditionType.STALLED, *stalled, generation)
            )
            status["conditions"] = conditions
            status["observedGeneration"] = generation
            status["epoch"] = layout.epoch
            status["nextSegmentId"] = layout.next_segment_id
            status["activeSegments"] = len(active)
            status["dag"] = render_dag(layout)
            previous = status.get("controller") or {}
            status["controller"] = {**previous, **controller}
            if previous.get("pod") != controller.get("pod") or not previous.get("since"):
                status["controller"]["since"] = format_time(self.clock())

        return await update_topic_status(self.kube, ns, name, change, topic=topic)

    async def _finalize(self, topic: Body) -> None:
        meta = topic["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if FINALIZER not in (meta.get("finalizers") or []):
            return
        segments = await self.kube.list_segments(ns, name)
        for seg in segments:
            url = self.cache.broker_url_of(seg)
            sid = int(seg["spec"]["segmentId"])
            if url:
                await self.brokers.delete_segment(url, ns, name, sid)
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
        if self.on_deleted:
            self.on_deleted(ns, name)
        log.info("%s/%s: deleted %d segment(s) and released the finalizer", ns, name, len(segments))


def _loose_id(raw: str) -> str:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return "invalid"
    return str(data.get("id", "invalid")) if isinstance(data, dict) else "invalid"

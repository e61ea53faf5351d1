"""Level-based reconciliation of one ScalableTopic by the leader of its shard (docs/operator.md).

Each pass reads the topic fresh, compares what should be with what is, does what is missing,
and writes the status only when it changed. Everything it does is idempotent, so a pass can be
interrupted anywhere (crash, lost Lease) and simply run again.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.jsontypes import JsonObj
from ..core.layout import SegmentLayout
from ..core.policy import (
    AutoScalePolicy,
    ClusterDefaults,
    PolicyError,
    Resolution,
    resolve_policy,
)
from ..core.rebuild import (
    BrokerReport,
    rebuild_layout,
    record_from_segment,
    subscription_entries,
    unfinished_creation,
)
from ..core.resources import (
    ANNOTATION_AUTOSCALE_POLICY,
    ANNOTATION_REQUEST,
    ConditionType,
    ControllerRef,
    Reason,
    ResourceValidationError,
    ScalableTopicSpec,
    ScalableTopicStatus,
    format_time,
    parse_topic_spec,
    topic_name_problem,
)
from ..core.topicstatus import (
    Restored,
    not_ready,
    read_status,
    reconciled,
    restore_layout,
    with_evaluation,
    with_layout,
    with_new_subscriptions,
    with_policy,
)
from ..core.transfer import ShedPolicy
from . import metrics
from .autoscalestatus import Outcome
from .brokers import BrokerAdmin
from .cache import TopicCache, layout_of
from .corruption import corrupted_segments
from .kube import Conflict, KubeApi
from .protocol import EventSink, NoBrokerAvailable, OperationExecutor
from .requests import RequestHandler, loose_request
from .restore import (
    BrokersUnanswered,
    adopt,
    broker_reports,
    controlled_by,
    record_epoch,
    write_missing_segments,
)
from .retention import RetentionKeeper
from .segments import SegmentKeeper, SegmentsUnavailable
from .status import TopicGone, change_topic_status
from .topics import ResolvedPolicies, TopicLocks
from .transfer import TransferExecutor

log = logging.getLogger(__name__)

FINALIZER = "scalabletopics.io/finalizer"
POLICY_ANNOTATION = ANNOTATION_AUTOSCALE_POLICY

Key = tuple[str, str]


COMPONENT = "scalable-topics-operator"


@dataclass(frozen=True)
class NewTopicStatus:
    """What other writers would write into a new topic's status right after it is Ready, given
    to the reconcile pass that makes it Ready so that it is one write (``new_topic_status``):
    the consumer hub's first ``subscriptions`` entries and the auto-scaler's first evaluation
    (``None`` when that evaluation would act: the auto-scaler does that itself)."""

    subscriptions: list[dict[str, Any]]
    evaluation: Outcome | None


NewTopicStatusFn = Callable[
    [JsonObj, SegmentLayout, ScalableTopicSpec, Resolution | None], NewTopicStatus
]


def settled(topic: JsonObj, *, has_segments: bool) -> bool:
    """Whether a reconcile pass may start from the watch cache's copy of ``topic`` instead of a
    read at the API server (``has_segments``: the cache holds Segments of the topic).

    The cache has every write of this replica as soon as the API server answered it
    (``KubeApi.on_topic_written``), so a copy can only be behind another writer's change (a
    person's, another replica's before this one led), whose watch event queues a pass of its
    own. Every write of a pass is a compare-and-swap on the resourceVersion it read, so such a
    copy costs a 409 and a fresh read, never a lost update. What it could do is act before any
    write: resume an operation, serve a request, rebuild a lost layout from the Segments or
    finalize a deletion. A copy that asks for one of those is not settled: the pass reads the
    topic fresh, as every pass did before. A new topic (no layout, no Segments) is settled:
    creating its layout is a compare-and-swap and its Segments' creates are idempotent."""
    meta = topic.get("metadata") or {}
    status = topic.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("operation"):
        return False
    if not status.get("layout") and has_segments:
        return False
    raw = (meta.get("annotations") or {}).get(ANNOTATION_REQUEST)
    if raw:
        handled = (status.get("lastRequest") or {}).get("id")
        if handled is None or loose_request(raw)[0] != str(handled):
            return False
    return True


def _unfinished_creation(
    topic: JsonObj, spec: ScalableTopicSpec, bodies: list[JsonObj], reports: list[BrokerReport]
) -> bool:
    """``core.rebuild.unfinished_creation`` for Segments all of this uid of the topic."""
    uid = str(topic["metadata"].get("uid"))
    if not all(controlled_by(b, uid) for b in bodies):
        return False
    try:
        records = [record_from_segment(b) for b in bodies]
    except ValueError:
        return False
    return unfinished_creation(records, reports, SegmentLayout.initial(spec.initial_segments))


def recording(status: ScalableTopicStatus, layout: SegmentLayout | None) -> ScalableTopicStatus:
    """``status`` with ``layout`` as a new topic's first layout, unless it has one already (a
    compare-and-swap found another writer's)."""
    return status if layout is None or status.layout else with_layout(status, layout)


def kube_events(kube: KubeApi) -> EventSink:
    """The events sink of the controller's parts: Kubernetes Events on the topic."""

    async def post(topic: JsonObj, type_: str, reason: str, message: str) -> None:
        await kube.post_event(
            topic, type_=type_, reason=reason, message=message, component=COMPONENT
        )

    return post


class TopicReconciler:
    """One pass over a topic at a time (``reconcile``): reads it, decides, and does what is
    missing through its collaborators (Segments, retention, manual requests, transfers, the
    operation protocol); every status change is a ``core.topicstatus`` function applied in a
    compare-and-swap (``status.change_topic_status``). Build one with :meth:`wired`."""

    def __init__(
        self,
        kube: KubeApi,
        brokers: BrokerAdmin,
        cache: TopicCache,
        executor: OperationExecutor,
        *,
        segments: SegmentKeeper,
        retention: RetentionKeeper,
        requests: RequestHandler,
        transfers: TransferExecutor,
        locks: TopicLocks,
        policies: ResolvedPolicies,
        events: EventSink,
        leads: Callable[[str, str], bool],
        controller_ref: Callable[[str, str], dict[str, Any]],
        defaults: AutoScalePolicy,
        on_deleted: Callable[[str, str], None] | None = None,
        on_reconciled: Callable[[str, str, JsonObj], None] | None = None,
        requeue_after: Callable[[Key, float], None] | None = None,
        new_topic_status: NewTopicStatusFn | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.brokers = brokers
        self.cache = cache
        self.executor = executor
        self.segments = segments
        self.retention = retention
        self.requests = requests
        self.transfers = transfers
        self.locks = locks
        self.policies = policies
        """The effective policy of each topic with every knob's source (``status.autoScale``),
        which the auto-scaler reads."""
        self.events = events
        self.leads = leads
        self.controller_ref = controller_ref
        self.defaults = defaults
        self.on_deleted = on_deleted
        """Called with (namespace, topic) once a topic is gone: the consumer hub forgets it."""
        self.on_reconciled = on_reconciled
        """Called with (namespace, topic, object) after each pass: the consumer hub serves it."""
        self.requeue_after = requeue_after
        """Asks for another pass of a topic in that many seconds (a retention deadline)."""
        self.new_topic_status = new_topic_status
        """What the pass that makes a new topic Ready writes for the other writers."""
        self.clock = clock
        self.cluster = ClusterDefaults()
        """The cluster-wide level (the ConfigMap the operator watches, ``clusterdefaults``)."""
        self._policy_state: dict[Key, tuple[Resolution | None, str | None]] = {}
        """This pass's resolution and policy problem, for ``status.autoScale``."""
        self._status_inputs: dict[Key, tuple[Any, tuple[Any, ...]]] = {}
        """Per topic, the resourceVersion whose status the last pass found (or wrote) current,
        and that pass's inputs to the status (``_write_status``)."""

    @classmethod
    def wired(
        cls,
        kube: KubeApi,
        brokers: BrokerAdmin,
        cache: TopicCache,
        executor: OperationExecutor,
        *,
        events: EventSink,
        leads: Callable[[str, str], bool],
        controller_ref: Callable[[str, str], dict[str, Any]],
        defaults: AutoScalePolicy,
        locks: TopicLocks | None = None,
        policies: ResolvedPolicies | None = None,
        on_deleted: Callable[[str, str], None] | None = None,
        on_reconciled: Callable[[str, str, JsonObj], None] | None = None,
        on_drained: Callable[[str, str, str, int], None] | None = None,
        requeue_after: Callable[[Key, float], None] | None = None,
        shed_policy: ShedPolicy | None = None,
        new_topic_status: NewTopicStatusFn | None = None,
        clock: Callable[[], float] = time.time,
    ) -> TopicReconciler:
        """A reconciler with its collaborators built for it. ``on_drained`` gets (namespace,
        topic, subscription, segment id) for a drain seen in broker stats (the consumer hub's
        ``segment_drained``); ``shed_policy`` is the transfers' load shedding."""
        transfers = TransferExecutor(
            kube, brokers, cache, events=events, requeue=lambda: requeue_after, clock=clock
        )
        if shed_policy is not None:
            transfers.shed_policy = shed_policy
        # Every pass, evaluation and operation step that reads the cache after a write of this
        # replica finds that write there (a pass starts from the cache: ``settled``).
        kube.on_topic_written = cache.put_topic
        segments = SegmentKeeper(kube, brokers, cache, executor, events=events, clock=clock)
        return cls(
            kube,
            brokers,
            cache,
            executor,
            segments=segments,
            retention=RetentionKeeper(
                kube, brokers, cache, segments, events=events, on_drained=on_drained, clock=clock
            ),
            requests=RequestHandler(
                kube, cache, executor, transfers, segments, events=events, clock=clock
            ),
            transfers=transfers,
            locks=locks or TopicLocks(),
            policies=policies or ResolvedPolicies(),
            events=events,
            leads=leads,
            controller_ref=controller_ref,
            defaults=defaults,
            on_deleted=on_deleted,
            on_reconciled=on_reconciled,
            requeue_after=requeue_after,
            new_topic_status=new_topic_status,
            clock=clock,
        )

    def new_stats_round(self) -> None:
        """Start a stats round (the resync loop calls it once per resync interval)."""
        self.retention.new_stats_round()

    def forget(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        metrics.forget_topic(namespace, name)
        self.segments.forget(key)
        self.retention.forget(key)
        self._policy_state.pop(key, None)
        self._status_inputs.pop(key, None)
        self.policies.drop(key)

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
            async with self.locks(key):
                try:
                    await self._reconcile(namespace, name)
                except Conflict:
                    # The cache's copy was behind the API server (another writer's change
                    # whose watch event had not come yet): the same pass, from a fresh read.
                    await self._reconcile(namespace, name, from_cache=False)
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

    async def _read(self, namespace: str, name: str, from_cache: bool) -> JsonObj | None:
        """The topic as the pass starts from: the watch cache's copy when it is
        ``settled``, else a read at the API server. A resync pass over a steady topic costs
        the API server nothing."""
        cached = self.cache.topics.get((namespace, name))
        if from_cache and cached is not None:
            has_segments = bool(self.cache.segments.get((namespace, name)))
            if settled(cached, has_segments=has_segments):
                metrics.TOPIC_READS.labels("cache").inc()
                return cached
        metrics.TOPIC_READS.labels("api").inc()
        return await self.kube.get_topic(namespace, name)

    async def _reconcile(self, namespace: str, name: str, *, from_cache: bool = True) -> None:
        topic = await self._read(namespace, name, from_cache)
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
        unrecorded: SegmentLayout | None = None
        """A new topic's first layout, recorded with its Ready status (one write, not two)."""
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
            if (topic["metadata"].get("annotations") or {}).get(ANNOTATION_REQUEST):
                # A request can start an operation in this very pass, whose intent is a
                # change of the recorded layout: record it first.
                topic, layout = await self._initialize(topic, spec)
            else:
                layout = unrecorded = SegmentLayout.initial(spec.initial_segments)

        if (topic.get("status") or {}).get("operation"):
            topic = await self.executor.resume(topic)
            layout = layout_of(topic) or layout
        topic = await self.transfers.resume(topic)
        topic = await self.transfers.drain(topic)
        topic = await self.transfers.shed(topic)

        try:
            await self.segments.ensure(topic, layout, spec, new=fresh)
        except (NoBrokerAvailable, SegmentsUnavailable) as exc:
            await self._not_ready(
                topic, Reason.BROKERS_UNAVAILABLE, str(exc), unrecorded=unrecorded
            )
            raise
        except Exception:
            if unrecorded is not None:
                # Segments of it may exist now: their layout goes on record before the error
                # is retried, as if it had been written first. (A crash here leaves them to
                # the next pass, which finishes the creation: ``_unfinished_creation``.)
                with contextlib.suppress(Exception):
                    await self._initialize(topic, spec)
            raise

        topic = await self.requests.handle(topic, layout, spec)
        layout = layout_of(topic) or layout
        topic, layout, look_again = await self.retention.retain(topic, layout, spec)
        problem = corrupted_segments(self.cache.segments.get((namespace, name), {}).values()) or (
            problem
        )
        previous = read_status(topic.get("status")).condition(ConditionType.READY)
        new_topic = None
        if fresh and self.new_topic_status is not None:
            new_topic = self.new_topic_status(topic, layout, spec, resolution)
        topic = await self._write_status(topic, layout, problem, new_topic, unrecorded)
        metrics.observe_layout(namespace, name, layout_of(topic) or layout)
        if problem and (
            not previous or previous.reason != problem[0] or previous.message != problem[1]
        ):
            await self.events(topic, "Warning", problem[0], problem[1])
        self.cache.put_topic(topic)
        self.policies.put((namespace, name), resolution)
        if self.on_reconciled:
            self.on_reconciled(namespace, name, topic)
        if look_again is not None and self.requeue_after is not None:
            self.requeue_after((namespace, name), look_again)

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
        # A new topic (none in a complete cache) is not looked up at the API server: a
        # label-selected LIST scans every Segment of the namespace there (46 ms at 20,000),
        # which made it the costliest request of a new topic at 10,000 topics.
        bodies: list[JsonObj] = []
        if not self.cache.segments_complete or self.cache.segments.get((ns, name)):
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
        if _unfinished_creation(topic, spec, bodies, reports):
            log.info(
                "%s/%s: %d Segment(s) of the first layout and no layout: finishing the "
                "creation a pass began",
                ns,
                name,
                len(bodies),
            )
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
        now = self.clock()
        outcomes: list[Restored] = []

        def change(status: ScalableTopicStatus, obj: JsonObj) -> ScalableTopicStatus:
            outcomes.clear()
            annotations = obj["metadata"].get("annotations") or {}
            restored = restore_layout(
                status,
                layout,
                subscriptions=subscriptions,
                operation=rebuilt.operation,
                request_annotation=annotations.get(ANNOTATION_REQUEST),
                now=now,
            )
            if restored is None:
                return status
            outcomes.append(restored)
            return restored.status

        topic = await change_topic_status(self.kube, ns, name, change, topic=topic)
        written = layout_of(topic)
        if not outcomes:  # another writer's layout came first: the next pass looks at it
            return None if written is None else (topic, written)
        resumed, unrun = outcomes[0].resumed, outcomes[0].unrun
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
            message += f"; resuming the interrupted operation {resumed}"
        if unrun:
            message += f"; request {unrun} is not run again (whether it ran is unknown)"
        log.warning("%s/%s: %s", ns, name, message)
        await self.events(topic, "Warning", "LayoutRebuilt", message)
        return topic, written

    async def _initialize(
        self, topic: JsonObj, spec: ScalableTopicSpec
    ) -> tuple[JsonObj, SegmentLayout]:
        layout = SegmentLayout.initial(spec.initial_segments)

        def change(status: ScalableTopicStatus, obj: JsonObj) -> ScalableTopicStatus:
            return recording(status, layout)

        meta = topic["metadata"]
        topic = await change_topic_status(
            self.kube, meta["namespace"], meta["name"], change, topic=topic
        )
        # Its Created event comes with the segments' placements (announce_placed).
        return topic, layout_of(topic) or layout

    async def _not_ready(
        self,
        topic: JsonObj,
        reason: str,
        message: str,
        *,
        stalled: bool = False,
        unbuilt: bool = False,
        unrecorded: SegmentLayout | None = None,
    ) -> None:
        """Ready=False (and Stalled=True if ``stalled``) with ``reason``; a Warning event when
        it is news. ``unbuilt``: nothing exists for the topic, and the status says so (no
        layout, 0 active segments) whatever an earlier pass wrote. ``unrecorded``: a new
        topic's first layout, recorded with it (its Segments may exist)."""
        meta = topic["metadata"]
        generation = meta.get("generation")
        previous = read_status(topic.get("status")).condition(ConditionType.READY)
        now = self.clock()
        topic = await change_topic_status(
            self.kube,
            meta["namespace"],
            meta["name"],
            lambda status, _: not_ready(
                recording(status, unrecorded),
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
            await self.events(topic, "Warning", reason, message)

    async def _write_status(
        self,
        topic: JsonObj,
        layout: SegmentLayout,
        problem: tuple[str, str] | None = None,
        new_topic: NewTopicStatus | None = None,
        unrecorded: SegmentLayout | None = None,
    ) -> JsonObj:
        """The level-based status; ``problem`` (reason, message) is a spec error that needs a
        human: Ready=False and Stalled=True with it, everything else as usual. ``new_topic``:
        what the other writers would write next into a topic this pass created;
        ``unrecorded``: its first layout."""
        meta = topic["metadata"]
        ns, name = meta["namespace"], meta["name"]
        generation = meta.get("generation")
        leader = self.controller_ref(ns, name)
        leftovers = self.segments.leftovers((ns, name))
        policy = self._policy_state.get((ns, name))
        inputs = (generation, layout, problem, tuple(leftovers), policy, sorted(leader.items()))
        steady = new_topic is None and unrecorded is None
        if steady and self._status_inputs.get((ns, name)) == (meta.get("resourceVersion"), inputs):
            return topic
        controller = ControllerRef.model_validate(leader)
        now = self.clock()

        def change(status: ScalableTopicStatus, obj: JsonObj) -> ScalableTopicStatus:
            status = reconciled(
                recording(status, unrecorded),
                layout,
                generation=generation,
                now=now,
                controller=controller,
                leftovers=leftovers,
                problem=problem,
            )
            if policy is not None:
                status = with_policy(status, *policy)
            if new_topic is not None:
                status = with_new_subscriptions(status, new_topic.subscriptions)
                if new_topic.evaluation is not None:
                    outcome = new_topic.evaluation
                    status = with_evaluation(
                        status, outcome.result, outcome.reasons, outcome.message, now
                    )
            return status

        written = await change_topic_status(self.kube, ns, name, change, topic=topic)
        if steady:
            # The status of this version is what these inputs make: until either changes, a
            # pass (a resync's over a steady topic) need not compute it again.
            self._status_inputs[(ns, name)] = (written["metadata"].get("resourceVersion"), inputs)
        return written

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

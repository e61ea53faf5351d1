"""Prometheus metrics of the operator, with PIP-483's names where PIP-483 names them."""

from __future__ import annotations

import contextlib
import weakref
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple, Protocol

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..core.layout import SegmentLayout

TOPIC_LABELS = ("namespace", "topic")


class TopicCounter(Counter):
    """A counter labelled (namespace, topic, …) that keeps each topic's children, so that
    forgetting a topic costs its own series: found by scanning every child, deleting 10,000
    topics one by one was quadratic (issue 17)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._by_topic: defaultdict[tuple[str, str], set[tuple[str, ...]]] = defaultdict(set)

    def labels(self, *values: Any, **named: Any) -> TopicCounter:
        child = super().labels(*values, **named)
        key = (
            tuple(str(v) for v in values)
            if values
            else tuple(str(named[n]) for n in self._labelnames)
        )
        self._by_topic[(key[0], key[1])].add(key)
        return child

    def forget(self, namespace: str, topic: str) -> None:
        """Remove every child of the topic."""
        for values in self._by_topic.pop((namespace, topic), ()):
            with contextlib.suppress(KeyError):
                self.remove(*values)


ACTIVE_SEGMENTS = Gauge(
    "scalable_topic_active_segments", "Active segments of a topic", TOPIC_LABELS
)
LAYOUT_EPOCH = Gauge("scalable_topic_layout_epoch", "Layout epoch of a topic", TOPIC_LABELS)
AUTO_SPLITS = Counter(
    "scalable_topic_auto_splits_total", "Splits decided by the auto-scaler", TOPIC_LABELS
)
AUTO_MERGES = Counter(
    "scalable_topic_auto_merges_total", "Merges decided by the auto-scaler", TOPIC_LABELS
)
AUTO_REBUCKETS = Counter(
    "scalable_topic_auto_rebuckets_total",
    "Rebucket rollovers decided by the auto-scaler",
    TOPIC_LABELS,
)
AUTOSCALE_EVALUATIONS = TopicCounter(
    "scalable_topic_autoscale_evaluations_total",
    "Auto-scale evaluations by outcome (status.autoScale.lastEvaluation.result: Acted, "
    "Recommended, Suppressed, Idle, Off)",
    (*TOPIC_LABELS, "result"),
)
AUTOSCALE_SUPPRESSED = TopicCounter(
    "scalable_topic_autoscale_suppressed_total",
    "Auto-scale evaluations where the rules wanted an action that a gate held back, by the "
    "gate (core.evaluator.Suppression values: max-segments, split-cooldown, unsplittable, "
    "buckets-unknown, bucket-max, buckets-suffice, min-segments, merge-cooldown, max-dag-depth, "
    "disabled, mode-off)",
    (*TOPIC_LABELS, "reason"),
)
OPERATIONS = TopicCounter(
    "scalable_topic_operations_total",
    "Layout operations finished, by kind, source and outcome",
    (*TOPIC_LABELS, "kind", "source", "outcome"),
)
OPERATION_SECONDS = Histogram(
    "scalable_topic_operation_duration_seconds",
    "Time from recording an operation's intent to committing its layout",
    ("kind",),
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
FAILOVERS = Counter(
    "scalable_topic_controller_failovers_total",
    "Times this replica became the leader of a shard",
    ("shard",),
)
LEADER = Gauge(
    "scalable_topic_controller_leader", "1 while this replica leads the shard", ("shard",)
)
HEALTHY = Gauge(
    "scalable_topic_operator_healthy",
    "1 while the liveness check passes, 0 while it fails (set on every /healthz evaluation)",
    ("check",),
)
RECONCILES = Counter(
    "scalable_topic_reconciles_total", "Topic reconciliations, by outcome", ("outcome",)
)
RECONCILE_SECONDS = Histogram(
    "scalable_topic_reconcile_duration_seconds",
    "Duration of one topic reconciliation",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
TOPIC_READS = Counter(
    "scalable_topic_reads_total",
    "Topics a reconcile pass started from, by source: the watch cache's copy or a read at the "
    "API server",
    ("source",),
)
STATUS_WRITES = Counter(
    "scalable_topic_status_writes_total",
    "Status writes, by object kind and outcome",
    ("kind", "outcome"),
)
SESSIONS = Gauge("scalable_topic_sessions", "Open WebSocket sessions by type", ("type",))
AUTH_REFUSALS = Counter(
    "scalable_topic_auth_refusals_total",
    "DAG watch and consumer session requests refused by --auth kubernetes, by code "
    "(Unauthenticated, Forbidden, AuthUnavailable)",
    ("code",),
)
RECOMMENDATIONS = TopicCounter(
    "scalable_topic_recommendations_total",
    "Recommendations seen by the leader, by outcome (accepted or the reason ignored)",
    (*TOPIC_LABELS, "outcome"),
)
PRUNED_SEGMENTS = Counter(
    "scalable_topic_pruned_segments_total",
    "Sealed, drained segments pruned from the DAG by retention",
    TOPIC_LABELS,
)
OBSERVED_DRAINS = Counter(
    "scalable_topic_observed_drains_total",
    "Sealed segments the controller saw drained for a stream subscription in broker stats "
    "(fed to the consumer hub)",
    TOPIC_LABELS,
)
DRAIN_CHECKS = Counter(
    "scalable_topic_drain_checks_total",
    "Broker stats calls for sealed segments (drain and retention checks), by outcome",
    ("outcome",),
)
LAYOUT_REBUILDS = TopicCounter(
    "scalable_topic_layout_rebuilds_total",
    "Topics found without status.layout that had Segments or broker data, by outcome: rebuilt "
    "from the Segments, rebuilt with segments only a broker still had, or failed (Stalled, "
    "LayoutLost; counted on every attempt)",
    (*TOPIC_LABELS, "outcome"),
)


class OperationInProgress(NamedTuple):
    namespace: str
    topic: str
    kind: str
    phase: str
    started: float
    """Unix seconds of ``status.operation.startedAt``."""


class OperationsSource(Protocol):
    def operations_in_progress(self) -> Iterable[OperationInProgress]: ...


class _OperationsInProgress(Collector):
    """``scalable_topic_operation_started_timestamp_seconds``: one series per split, merge or
    rebucket recorded in a led topic's ``status.operation``, read at each scrape from the
    ``sources`` of this replica (each adds itself when built: the leader's topic cache, read
    through ``controller.app.LedOperations``), so a stuck operation keeps its series and a
    finished or rolled-back one loses it without anyone having to remember to remove it."""

    NAME = "scalable_topic_operation_started_timestamp_seconds"
    DOC = (
        "Start (status.operation.startedAt, Unix seconds) of the operation in progress on a "
        "topic this replica leads, by kind and the last phase completed"
    )

    def __init__(self) -> None:
        self.sources: weakref.WeakSet[OperationsSource] = weakref.WeakSet()

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.NAME, self.DOC, labels=[*TOPIC_LABELS, "kind", "phase"])

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = self._family()
        for source in list(self.sources):
            for op in source.operations_in_progress():
                family.add_metric([op.namespace, op.topic, op.kind, op.phase], op.started)
        yield family


OPERATIONS_IN_PROGRESS = _OperationsInProgress()
REGISTRY.register(OPERATIONS_IN_PROGRESS)


class KeySharedSample(NamedTuple):
    """Key-shared consumption (PIP-486) of one consumable segment of a Stream subscription."""

    namespace: str
    topic: str
    subscription: str
    segment: int
    buckets: int
    consumers: int
    withheld: int
    drain_wide: bool
    reassignments: int


class KeySharedSource(Protocol):
    def key_shared_samples(self) -> Iterable[KeySharedSample]: ...


class _KeyShared(Collector):
    """PIP-486's per-segment metrics, read at each scrape from the consumer hubs of this
    replica (``sources``), so a segment drained, a subscription dropped or a topic lost takes
    its series with it."""

    LABELS = (*TOPIC_LABELS, "subscription", "segment")

    def __init__(self) -> None:
        self.sources: weakref.WeakSet[KeySharedSource] = weakref.WeakSet()

    def _families(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        labels = list(self.LABELS)
        return [
            GaugeMetricFamily(
                "scalable_topic_segment_buckets",
                "Entry-bucket count N of a segment being consumed by a Stream subscription",
                labels=labels,
            ),
            GaugeMetricFamily(
                "scalable_topic_segment_consumers",
                "Consumers of a Stream subscription reading (buckets of) a consumable segment",
                labels=labels,
            ),
            GaugeMetricFamily(
                "scalable_topic_buckets_withheld",
                "Buckets of a segment withheld for a hand-off: taken from a consumer that has "
                "not released them yet (persistently above 0: a hand-off is stuck)",
                labels=labels,
            ),
            GaugeMetricFamily(
                "scalable_topic_segment_drain_wide",
                "1 while a sealed segment's backlog is drained by more than one consumer",
                labels=labels,
            ),
            CounterMetricFamily(
                "scalable_topic_bucket_reassignments",
                "Buckets of a segment that changed consumer (since this replica leads)",
                labels=labels,
            ),
        ]

    def describe(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        buckets, consumers, withheld, drain, moves = self._families()
        for source in list(self.sources):
            for x in source.key_shared_samples():
                values = [x.namespace, x.topic, x.subscription, str(x.segment)]
                buckets.add_metric(values, x.buckets)
                consumers.add_metric(values, x.consumers)
                withheld.add_metric(values, x.withheld)
                drain.add_metric(values, 1.0 if x.drain_wide else 0.0)
                moves.add_metric(values, x.reassignments)
        yield from (buckets, consumers, withheld, drain, moves)


KEY_SHARED = _KeyShared()
REGISTRY.register(KEY_SHARED)


TOPIC_COUNTERS = (AUTO_SPLITS, AUTO_MERGES, AUTO_REBUCKETS, PRUNED_SEGMENTS, OBSERVED_DRAINS)
"""Per-topic counters with no other label: they start at 0 when the leader first observes the
topic, so a topic that never split still has a series (its dashboard panel shows 0, not "no
data") and ``increase()`` counts the first event (a series born at 1 counts nothing)."""


def observe_layout(namespace: str, topic: str, layout: SegmentLayout) -> None:
    """Set the per-topic gauges from the committed layout (the leader calls this)."""
    ACTIVE_SEGMENTS.labels(namespace, topic).set(len(layout.active()))
    LAYOUT_EPOCH.labels(namespace, topic).set(layout.epoch)
    for counter in TOPIC_COUNTERS:
        counter.labels(namespace, topic)


def forget_topic(namespace: str, topic: str) -> None:
    """Drop the per-topic series of a topic this replica no longer leads (deleted, or its
    shard's lease lost), so no stale series stays behind for the new leader to contradict (the
    new leader's counters start again at 0, which ``rate``/``increase`` take as a reset)."""
    forget_topics([(namespace, topic)])


def forget_topics(topics: Iterable[tuple[str, str]]) -> None:
    """:func:`forget_topic` of many (namespace, topic): each costs its own series only (a lost
    shard of 10,000 topics once collected every child of five families per topic, which blocked
    the event loop for minutes and made the liveness probe kill the replica; issue 17)."""
    for namespace, topic in set(topics):
        for metric in (ACTIVE_SEGMENTS, LAYOUT_EPOCH, *TOPIC_COUNTERS):
            with contextlib.suppress(KeyError):
                metric.remove(namespace, topic)
        for family in (
            OPERATIONS,
            AUTOSCALE_SUPPRESSED,
            AUTOSCALE_EVALUATIONS,
            RECOMMENDATIONS,
            LAYOUT_REBUILDS,
        ):
            family.forget(namespace, topic)

"""Prometheus metrics of the operator, with PIP-483's names where PIP-483 names them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..core.layout import SegmentLayout

TOPIC_LABELS = ("namespace", "topic")

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
AUTOSCALE_SUPPRESSED = Counter(
    "scalable_topic_autoscale_suppressed_total",
    "Auto-scale evaluations where the rules wanted an action that a gate held back, by the "
    "gate (core.evaluator.Suppression values: max-segments, split-cooldown, unsplittable, "
    "buckets-unknown, bucket-max, buckets-suffice, min-segments, merge-cooldown, max-dag-depth, "
    "disabled)",
    (*TOPIC_LABELS, "reason"),
)
OPERATIONS = Counter(
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
RECOMMENDATIONS = Counter(
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
LAYOUT_REBUILDS = Counter(
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


class _OperationsInProgress(Collector):
    """``scalable_topic_operation_started_timestamp_seconds``: one series per split, merge or
    rebucket recorded in a led topic's ``status.operation``, read at each scrape from
    :attr:`source` (the leader's topic cache), so a stuck operation keeps its series and a
    finished or rolled-back one loses it without anyone having to remember to remove it."""

    NAME = "scalable_topic_operation_started_timestamp_seconds"
    DOC = (
        "Start (status.operation.startedAt, Unix seconds) of the operation in progress on a "
        "topic this replica leads, by kind and the last phase completed"
    )

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[OperationInProgress]] = tuple

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.NAME, self.DOC, labels=[*TOPIC_LABELS, "kind", "phase"])

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = self._family()
        for op in self.source():
            family.add_metric([op.namespace, op.topic, op.kind, op.phase], op.started)
        yield family


OPERATIONS_IN_PROGRESS = _OperationsInProgress()
REGISTRY.register(OPERATIONS_IN_PROGRESS)


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
    for metric in (ACTIVE_SEGMENTS, LAYOUT_EPOCH, *TOPIC_COUNTERS):
        with contextlib.suppress(KeyError):
            metric.remove(namespace, topic)
    for family in (OPERATIONS, AUTOSCALE_SUPPRESSED, RECOMMENDATIONS, LAYOUT_REBUILDS):
        _remove_matching(family, namespace, topic)


def _remove_matching(metric: Counter, namespace: str, topic: str) -> None:
    """Remove every child of ``metric`` (labelled namespace, topic, …) of this topic. Its
    samples carry the label values in the metric's label order, which ``remove`` takes."""
    children = {
        tuple(sample.labels.values())
        for family in metric.collect()
        for sample in family.samples
        if sample.labels.get("namespace") == namespace and sample.labels.get("topic") == topic
    }
    for values in children:
        with contextlib.suppress(KeyError):
            metric.remove(*values)

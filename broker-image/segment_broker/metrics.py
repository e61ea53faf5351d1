"""Prometheus metrics of the segment broker.

Hot-path counters (entries, messages and bytes in and out) are plain integers on each segment
and are turned into metric families only when ``/metrics`` is scraped (a custom collector), so
producing and dispatching never touch a prometheus-client lock per entry. Histograms are
observed per SEND frame or per group-commit chunk (hundreds per second, not per entry).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .storage.segment import COMMIT_STAGES

if TYPE_CHECKING:
    from .storage.segment import Segment


class MeteredSegment(Protocol):
    """What ``/metrics`` reads of a hosted segment (``store.HostedSegment``, which imports this
    module for its counters)."""

    @property
    def segment(self) -> Segment: ...

    def backlog(self) -> dict[str, int]: ...


_SEG_LABELS = ["namespace", "topic", "segment"]

PRODUCE_STAGES = ("frame", *COMMIT_STAGES, "ack")

FSYNC_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)


class _SegmentCollector(Collector):
    def __init__(self, segments: Callable[[], Iterable[MeteredSegment]]) -> None:
        self._segments = segments

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        backlog = GaugeMetricFamily(
            "segment_broker_backlog_entries",
            "Entries written and not acknowledged, per subscription",
            labels=[*_SEG_LABELS, "subscription"],
        )
        in_flight = GaugeMetricFamily(
            "segment_broker_entries_in_flight",
            "Entries staged and not yet durable (waiting for the group commit)",
            labels=_SEG_LABELS,
        )
        sealed = GaugeMetricFamily(
            "segment_broker_segment_sealed", "1 when the segment is sealed", labels=_SEG_LABELS
        )
        last = GaugeMetricFamily(
            "segment_broker_last_position", "Last durable position", labels=_SEG_LABELS
        )
        log_bytes = GaugeMetricFamily(
            "segment_broker_log_bytes", "Bytes in the segment's log files", labels=_SEG_LABELS
        )
        corrupt = GaugeMetricFamily(
            "segment_broker_corrupt_segments",
            "Segments quarantined because their log is corrupted (appends refused until an "
            "operator truncates them)",
        )
        corrupt_count = 0
        counters = {
            name: CounterMetricFamily(f"segment_broker_{name}", doc, labels=_SEG_LABELS)
            for name, doc in (
                ("produced_entries", "Entries made durable"),
                ("produced_messages", "Messages in entries made durable"),
                ("produced_bytes", "Entry bytes made durable"),
                ("consumed_entries", "Entries dispatched to consumers (redeliveries included)"),
                ("consumed_messages", "Messages dispatched to consumers"),
                ("consumed_bytes", "Entry bytes dispatched to consumers"),
                ("duplicate_entries", "Entries refused as producer duplicates (acked again)"),
                ("fsyncs", "fdatasync calls of the segment's log"),
            )
        }
        for hosted in self._segments():
            seg = hosted.segment
            meta = seg.meta
            labels = [meta.namespace, meta.topic, str(meta.segment_id)]
            for name, count in hosted.backlog().items():
                backlog.add_metric([*labels, name], count)
            in_flight.add_metric(labels, seg.in_flight)
            sealed.add_metric(labels, 1 if seg.sealed else 0)
            last.add_metric(labels, seg.visible_position)
            log_bytes.add_metric(labels, seg.log.total_bytes)
            if seg.corruption is not None:
                corrupt_count += 1
            for name, value in (
                ("produced_entries", seg.entries_in),
                ("produced_messages", seg.messages_in),
                ("produced_bytes", seg.bytes_in),
                ("consumed_entries", seg.entries_out),
                ("consumed_messages", seg.messages_out),
                ("consumed_bytes", seg.bytes_out),
                ("duplicate_entries", seg.duplicates),
                ("fsyncs", seg.fsyncs),
            ):
                counters[name].add_metric(labels, value)
        yield backlog
        yield in_flight
        yield sealed
        yield last
        yield log_bytes
        corrupt.add_metric([], corrupt_count)
        yield corrupt
        yield from counters.values()


class BrokerMetrics:
    """All metrics of one broker, in their own registry (several brokers can share a process
    in tests)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.fsync_seconds = Histogram(
            "segment_broker_fsync_seconds",
            "Duration of one group-commit write + fdatasync",
            buckets=FSYNC_BUCKETS,
            registry=self.registry,
        )
        self.produce_stage_seconds = Histogram(
            "segment_broker_produce_stage_seconds",
            "Where a produced entry's time goes before its ack, by stage: frame (decoding and "
            "staging one SEND frame, on the event loop), stage / write / sync / visible (one "
            "group-commit chunk: the rest of the loop pass, the writer thread, waiting for and "
            "running fdatasync, the thread-to-loop handoff) and ack (visible until the "
            "producer connection encodes its acks)",
            ["stage"],
            buckets=FSYNC_BUCKETS,
            registry=self.registry,
        )
        self._stages = {s: self.produce_stage_seconds.labels(s) for s in PRODUCE_STAGES}
        self.event_loop_lag_seconds = Histogram(
            "segment_broker_event_loop_lag_seconds",
            "How late a timer due every 50 ms fires on the event loop (a stall: SEND frames "
            "then wait in the socket, before any produce stage starts)",
            buckets=FSYNC_BUCKETS,
            registry=self.registry,
        )
        self.gc_pause_seconds = Histogram(
            "segment_broker_gc_pause_seconds",
            "Collections of Python's cyclic garbage collector by generation (the whole "
            "process stops for each)",
            ["generation"],
            buckets=FSYNC_BUCKETS,
            registry=self.registry,
        )
        self.protocol_errors = Counter(
            "segment_broker_protocol_errors_total",
            "Connections closed for a protocol violation, by kind",
            ["kind"],
            registry=self.registry,
        )
        self.load_report_threshold = Gauge(
            "segment_broker_load_report_threshold",
            "Relative move of a segment's rates or backlog that rewrites Segment.status.load "
            "or backlog (loadReportThreshold of the ConfigMap scalable-topics-autoscale-defaults)",
            registry=self.registry,
        )
        self.settings_problems = Counter(
            "segment_broker_settings_problems_total",
            "Reads of the ConfigMap scalable-topics-autoscale-defaults with an invalid value of "
            "a setting the broker uses, by key (the previous value was kept)",
            ["key"],
            registry=self.registry,
        )
        self.torn_tail_truncations = Counter(
            "segment_broker_torn_tail_truncations_total",
            "Log files truncated at recovery because their tail was torn by a crash (damage "
            "with nothing intact after it)",
            registry=self.registry,
        )
        self.corruptions = Counter(
            "segment_broker_corruptions_total",
            "Segments found corrupted and quarantined, by who found it: recovery or a read",
            ["source"],
            registry=self.registry,
        )
        self.corruption_truncations = Counter(
            "segment_broker_corruption_truncations_total",
            "Corrupted segments truncated by an operator's admin call (acknowledged loss)",
            registry=self.registry,
        )
        self.connections = Counter(
            "segment_broker_connections_total",
            "WebSocket connections accepted, by role",
            ["role"],
            registry=self.registry,
        )

        self.fenced_handshakes = Counter(
            "segment_broker_fenced_handshakes_total",
            "Produce handshakes that found their segment fenced (a split/merge child before "
            "its activation), by outcome: opened (activated while held) or refused",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in ("opened", "refused"):
            self.fenced_handshakes.labels(outcome)
        self.auth_refusals = Counter(
            "segment_broker_auth_refusals_total",
            "Requests and connections refused by --auth kubernetes, by code: Unauthenticated "
            "(no, invalid, expired or wrong-audience token), Forbidden (RBAC), AuthUnavailable "
            "(the API server could not be asked)",
            ["code"],
            registry=self.registry,
        )

    def observe_stage(self, stage: str, seconds: float) -> None:
        """One observation of ``segment_broker_produce_stage_seconds{stage}``."""
        self._stages[stage].observe(seconds)

    def watch_segments(self, segments: Callable[[], Iterable[MeteredSegment]]) -> None:
        self.registry.register(_SegmentCollector(segments))

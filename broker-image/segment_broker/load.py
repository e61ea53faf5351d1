"""Per-segment load accounting: rolling rates, threshold-gated reporting, load history.

The hot path (`SegmentLoad.record_in` / `record_out`) only bumps counters. Everything else
happens once per interval in `LoadTracker.tick`, which closes a 10 s bucket for every segment
and derives the 60 s rolling rates from the last buckets. `LoadTracker.run` drives `tick` and
fans the samples out to

- a `LoadReporter` (the Kubernetes writer of `Segment.status.load`, usually wrapped in a
  `ThresholdReporter` so that only moves of more than 25 % are written, as PIP-483 does),
  and, when it is a `BacklogReporter` too, each subscription's backlog
  (`Segment.status.backlog`, the same 25 % rule),
- a `HistoryWriter` (JSON lines read by the recommender; schema in `docs/load-history.md`),
- the Prometheus gauges `segment_broker_{msg,bytes}_rate_{in,out}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import socket
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, runtime_checkable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

__all__ = [
    "HIST_BINS",
    "BacklogReporter",
    "HistoryWriter",
    "LoadRecord",
    "LoadReporter",
    "LoadTracker",
    "RecordedZeroReporter",
    "SegmentLoad",
    "SegmentRates",
    "ThresholdReporter",
    "hist_bin",
]

log = logging.getLogger(__name__)

HIST_BINS = 16
"""Number of key-hash histogram bins per segment and interval."""

SegmentKey = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class SegmentRates:
    """Rolling per-second rates of one segment (the four PIP-483 load metrics)."""

    msg_rate_in: float = 0.0
    bytes_rate_in: float = 0.0
    msg_rate_out: float = 0.0
    bytes_rate_out: float = 0.0

    def as_tuple(self) -> tuple[float, float, float, float]:
        return (self.msg_rate_in, self.bytes_rate_in, self.msg_rate_out, self.bytes_rate_out)

    def to_status(self) -> dict[str, float]:
        """The camelCase form used in `Segment.status.load` and in the load history."""
        return {
            "msgRateIn": self.msg_rate_in,
            "bytesRateIn": self.bytes_rate_in,
            "msgRateOut": self.msg_rate_out,
            "bytesRateOut": self.bytes_rate_out,
        }


@dataclass(frozen=True, slots=True)
class LoadRecord:
    """One segment's sample for one interval: the unit of reporting and of the history."""

    ts: float
    namespace: str
    topic: str
    segment_id: int
    descriptor: str
    range_start: int
    range_end: int
    rates: SegmentRates
    messages_in: int
    key_hist: tuple[int, ...]
    backlog: Mapping[str, int] = field(default_factory=dict)
    """Entries not acknowledged, per subscription (not part of the history line)."""

    def to_json(self) -> dict[str, object]:
        """The history line (`docs/load-history.md`); field names are the contract."""
        return {
            "ts": self.ts,
            "namespace": self.namespace,
            "topic": self.topic,
            "segmentId": self.segment_id,
            "descriptor": self.descriptor,
            "rangeStart": self.range_start,
            "rangeEnd": self.range_end,
            **self.rates.to_status(),
            "messagesIn": self.messages_in,
            "keyHist": list(self.key_hist),
        }

    def to_line(self) -> str:
        """:meth:`to_json` as a compact JSON line with its newline. A segment's identity is
        rendered once, and a record without traffic has a constant tail: most of a broker's
        records are such (json.dumps of each was a third of sampling 7,000 idle segments)."""
        identity = _identity_json(
            self.namespace,
            self.topic,
            self.segment_id,
            self.descriptor,
            self.range_start,
            self.range_end,
        )
        if self.rates == ZERO_RATES and not self.messages_in and self.key_hist == ZERO_HIST:
            tail = _QUIET_TAIL
        else:
            tail = _compact(
                {**self.rates.to_status(), "messagesIn": self.messages_in, "keyHist": self.key_hist}
            )[1:]
        return f'{{"ts":{_compact(self.ts)},{identity},{tail}\n'


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


@functools.lru_cache(maxsize=1 << 16)
def _identity_json(
    namespace: str, topic: str, segment_id: int, descriptor: str, start: int, end: int
) -> str:
    """The identity fields of a segment's history line, without braces."""
    return _compact(
        {
            "namespace": namespace,
            "topic": topic,
            "segmentId": segment_id,
            "descriptor": descriptor,
            "rangeStart": start,
            "rangeEnd": end,
        }
    )[1:-1]


ZERO_RATES = SegmentRates()
ZERO_HIST = (0,) * HIST_BINS
_QUIET_TAIL = _compact({**ZERO_RATES.to_status(), "messagesIn": 0, "keyHist": ZERO_HIST})[1:]


def hist_bin(hash_value: int, start: int, end: int) -> int | None:
    """Histogram bin of a segment hash inside `[start, end]`, or None when outside the range.

    Bin `i` covers `[start + i*size//16, start + (i+1)*size//16 - 1]` with
    `size = end - start + 1`; bins are empty when the range is narrower than 16 hashes.
    `(16*d + 15) // size` is the closed form of "the last bin whose lower bound is <= d".
    """
    d = hash_value - start
    size = end - start + 1
    if d < 0 or d >= size:
        return None
    return (HIST_BINS * d + HIST_BINS - 1) // size


@dataclass(slots=True)
class _Bucket:
    start: float
    end: float
    msgs_in: int
    bytes_in: int
    msgs_out: int
    bytes_out: int


def _busy(bucket: _Bucket) -> bool:
    return bool(bucket.msgs_in or bucket.bytes_in or bucket.msgs_out or bucket.bytes_out)


class SegmentLoad:
    """Counters of one segment. `record_*` run on every durable entry / dispatch: O(1)."""

    __slots__ = (
        "_buckets",
        "_busy",
        "_bytes_in",
        "_bytes_out",
        "_hist",
        "_msgs_in",
        "_msgs_out",
        "_open_since",
        "_size",
        "backlog_source",
        "descriptor",
        "namespace",
        "range_end",
        "range_start",
        "segment_id",
        "topic",
    )

    def __init__(
        self,
        namespace: str,
        topic: str,
        segment_id: int,
        descriptor: str,
        hash_range: tuple[int, int],
        *,
        created_at: float,
        buckets: int,
    ) -> None:
        start, end = hash_range
        if not 0 <= start <= end <= 0xFFFF:
            raise ValueError(f"invalid hash range {start:#x}-{end:#x}")
        self.namespace = namespace
        self.topic = topic
        self.segment_id = segment_id
        self.descriptor = descriptor
        self.range_start = start
        self.range_end = end
        self._size = end - start + 1
        self._msgs_in = 0
        self._bytes_in = 0
        self._msgs_out = 0
        self._bytes_out = 0
        self._hist = [0] * HIST_BINS
        self._open_since = created_at
        self._buckets: deque[_Bucket] = deque(maxlen=buckets)
        self._busy = 0
        """How many of the retained buckets counted anything: none, and the rates are zero."""
        self.backlog_source: Callable[[], Mapping[str, int]] | None = None
        """Set by whoever hosts the segment: its backlog per subscription, read at each tick."""

    def record_in(self, messages: int, nbytes: int, key_hash_sample: int | None) -> None:
        """Count a durable entry of `messages` messages and `nbytes` payload bytes.

        `key_hash_sample` is the segment hash (`raw >> 16`) of one key of the entry; it adds
        `messages` to that hash's histogram bin. Samples outside the segment's range (which a
        correct producer never sends) and unkeyed entries (None) are not binned.
        """
        self._msgs_in += messages
        self._bytes_in += nbytes
        if key_hash_sample is not None:
            d = key_hash_sample - self.range_start
            if 0 <= d < self._size:
                self._hist[(HIST_BINS * d + HIST_BINS - 1) // self._size] += messages

    def record_out(self, messages: int, nbytes: int) -> None:
        """Count `messages` messages of `nbytes` bytes dispatched to consumers."""
        self._msgs_out += messages
        self._bytes_out += nbytes

    def close_bucket(self, now: float) -> tuple[SegmentRates, int, tuple[int, ...]]:
        """Close the open bucket at `now`; return the rolling rates, its count and histogram.

        The rates are the sums over the retained buckets (the last `window / interval` ones)
        divided by the time they span, so a young segment is not diluted by time it did not
        exist, and a late tick stretches the window rather than inflating the rate.
        """
        end = max(now, self._open_since)
        buckets = self._buckets
        if len(buckets) == buckets.maxlen and _busy(buckets[0]):
            self._busy -= 1
        bucket = _Bucket(
            self._open_since, end, self._msgs_in, self._bytes_in, self._msgs_out, self._bytes_out
        )
        buckets.append(bucket)
        self._open_since = end
        if not _busy(bucket):
            if not self._busy:
                return ZERO_RATES, 0, ZERO_HIST
            hist = ZERO_HIST
        else:
            self._busy += 1
            hist = tuple(self._hist)
            self._msgs_in = self._bytes_in = self._msgs_out = self._bytes_out = 0
            self._hist = [0] * HIST_BINS
        span = end - buckets[0].start
        if span <= 0:
            return ZERO_RATES, bucket.msgs_in, hist
        msgs_in = bytes_in = msgs_out = bytes_out = 0
        for b in buckets:
            msgs_in += b.msgs_in
            bytes_in += b.bytes_in
            msgs_out += b.msgs_out
            bytes_out += b.bytes_out
        rates = SegmentRates(msgs_in / span, bytes_in / span, msgs_out / span, bytes_out / span)
        return rates, bucket.msgs_in, hist


class LoadReporter(Protocol):
    """Where a segment's rates go (the operator's writer patches `Segment.status.load`)."""

    async def write(
        self, namespace: str, topic: str, segment_id: int, rates: SegmentRates
    ) -> None: ...


@runtime_checkable
class BacklogReporter(Protocol):
    """A reporter that also takes a segment's backlog per subscription
    (``Segment.status.backlog``)."""

    async def write_backlog(
        self, namespace: str, topic: str, segment_id: int, backlog: Mapping[str, int]
    ) -> None: ...


@runtime_checkable
class StatusReporter(Protocol):
    """A reporter that writes a segment's rates and backlog in one call (the Kubernetes one:
    one status patch instead of two). ``None`` leaves that part as it is."""

    async def write_status(
        self,
        namespace: str,
        topic: str,
        segment_id: int,
        rates: SegmentRates | None,
        backlog: Mapping[str, int] | None,
    ) -> None: ...


@runtime_checkable
class ForgettingReporter(Protocol):
    """A reporter that keeps per-segment state and can drop it when the segment goes away."""

    def forget(self, namespace: str, topic: str, segment_id: int) -> None: ...


@runtime_checkable
class RecordedZeroReporter(Protocol):
    """A reporter told that a new segment's zero load is already on record (the operator wrote
    it with the segment's placement), so that it does not write it again."""

    def zero_recorded(
        self, namespace: str, topic: str, segment_id: int, subscriptions: Iterable[str]
    ) -> None: ...


class ThresholdReporter:
    """Forwards a segment's rates only when they moved by more than `threshold` (25 %).

    Rule, per segment, against the rates of the last *successful* forwarded write:

    - the first sample of a segment is always forwarded;
    - a sample is forwarded when any of the four rates satisfies `|new - old| > threshold * old`;
    - hence zero -> non-zero (any positive amount) and non-zero -> zero always count as a move,
      and zero -> zero never does.

    A stable load is deliberately *not* re-written periodically: the controller's merge rule
    needs the sample's modification time to age past `mergeWindow`. A failed inner write
    propagates and leaves the reference unchanged, so the next tick retries.

    A backlog (`write_backlog`, forwarded only to an inner `BacklogReporter`) follows the same
    rule per subscription, and a subscription that appeared or went is a move too: an idle
    system (every backlog steady) makes no writes.
    """

    def __init__(self, inner: LoadReporter, threshold: float = 0.25) -> None:
        if threshold < 0:
            raise ValueError("threshold must be >= 0")
        self.inner = inner
        self.threshold = threshold
        # What the inner reporter takes, asked once (an ``isinstance`` against a
        # runtime-checkable protocol walks its attributes: per segment and step, it was most of
        # the CPU of sampling idle segments).
        self._status_inner = inner if isinstance(inner, StatusReporter) else None
        self._backlog_inner = inner if isinstance(inner, BacklogReporter) else None
        self._last: dict[SegmentKey, SegmentRates] = {}
        self._last_backlog: dict[SegmentKey, dict[str, int]] = {}

    def _changed(self, old: float, new: float) -> bool:
        return abs(new - old) > self.threshold * old

    def moved(self, old: SegmentRates | None, new: SegmentRates) -> bool:
        if old is None:
            return True
        if old == new:
            return False
        return any(self._changed(o, n) for o, n in zip(old.as_tuple(), new.as_tuple(), strict=True))

    def backlog_moved(self, old: Mapping[str, int] | None, new: Mapping[str, int]) -> bool:
        if old is None or old.keys() != new.keys():
            return True
        if old == new:
            return False
        return any(self._changed(old[name], count) for name, count in new.items())

    async def write(self, namespace: str, topic: str, segment_id: int, rates: SegmentRates) -> None:
        key = (namespace, topic, segment_id)
        if not self.moved(self._last.get(key), rates):
            return
        await self.inner.write(namespace, topic, segment_id, rates)
        self._last[key] = rates

    async def write_backlog(
        self, namespace: str, topic: str, segment_id: int, backlog: Mapping[str, int]
    ) -> None:
        if self._backlog_inner is None:
            return
        key = (namespace, topic, segment_id)
        if not self.backlog_moved(self._last_backlog.get(key), backlog):
            return
        await self._backlog_inner.write_backlog(namespace, topic, segment_id, backlog)
        self._last_backlog[key] = dict(backlog)

    async def write_status(
        self,
        namespace: str,
        topic: str,
        segment_id: int,
        rates: SegmentRates | None,
        backlog: Mapping[str, int] | None,
    ) -> None:
        """:meth:`write` and :meth:`write_backlog` of one sample (None: that part is not
        reported), in one inner call when the inner reporter is a :class:`StatusReporter` (a
        new segment's first sample moves both): one API write per segment and interval."""
        inner = self._status_inner
        if inner is None:
            if rates is not None:
                await self.write(namespace, topic, segment_id, rates)
            if backlog is not None:
                await self.write_backlog(namespace, topic, segment_id, backlog)
            return
        key = (namespace, topic, segment_id)
        due_rates = rates if rates is not None and self.moved(self._last.get(key), rates) else None
        due_backlog = (
            backlog
            if backlog is not None and self.backlog_moved(self._last_backlog.get(key), backlog)
            else None
        )
        if due_rates is None and due_backlog is None:
            return
        await inner.write_status(namespace, topic, segment_id, due_rates, due_backlog)
        if due_rates is not None:
            self._last[key] = due_rates
        if due_backlog is not None:
            self._last_backlog[key] = dict(due_backlog)

    def forget(self, namespace: str, topic: str, segment_id: int) -> None:
        self._last.pop((namespace, topic, segment_id), None)
        self._last_backlog.pop((namespace, topic, segment_id), None)
        if isinstance(self.inner, ForgettingReporter):
            self.inner.forget(namespace, topic, segment_id)

    def zero_recorded(
        self, namespace: str, topic: str, segment_id: int, subscriptions: Iterable[str]
    ) -> None:
        """The reference of a new segment is zero rates and zero backlogs: its first sample
        is written only if it moved from there (at 10,000 topics, the brokers' first report of
        every new segment was 2 of the 4 Segment status writes per topic; issue 17)."""
        key = (namespace, topic, segment_id)
        self._last[key] = SegmentRates()
        self._last_backlog[key] = dict.fromkeys(subscriptions, 0)


def _default_broker_id() -> str:
    return os.environ.get("POD_NAME") or socket.gethostname()


@functools.lru_cache(maxsize=16)
def history_partition(ts: float) -> str:
    """``dt=YYYY-MM-DD/hour=HH`` of ``ts`` (UTC): the load history's Hive-style partition.
    Cached: every record of a sampling step has the same ``ts``."""
    t = datetime.fromtimestamp(ts, tz=UTC)
    return f"dt={t:%Y-%m-%d}/hour={t:%H}"


class HistorySink(Protocol):
    """Where the load history goes: :class:`HistoryWriter` (a directory) or
    ``s3history.S3HistoryWriter`` (an object store). ``write`` runs in a thread."""

    def write(self, records: Iterable[LoadRecord]) -> None: ...


class HistoryWriter:
    """Appends load records as JSON lines under `root/dt=YYYY-MM-DD/hour=HH/<broker-id>.jsonl`.

    The partition is the UTC date and hour of each record's `ts`. One file per broker and hour
    keeps writers independent (no cross-broker locking on a shared volume); lines are written
    with one `write` per file per interval so a reader sees whole lines in practice. The
    history is telemetry, not data: it is not fsynced.
    """

    def __init__(self, root: Path, *, broker_id: str | None = None) -> None:
        self.root = Path(root)
        self.broker_id = broker_id or _default_broker_id()
        if not self.broker_id or "/" in self.broker_id:
            raise ValueError(f"invalid broker id {self.broker_id!r}")

    def path_for(self, ts: float) -> Path:
        return self.root / history_partition(ts) / f"{self.broker_id}.jsonl"

    def write(self, records: Iterable[LoadRecord]) -> None:
        by_path: dict[Path, list[str]] = {}
        ts: float | None = None
        lines: list[str] = []
        for r in records:
            if r.ts != ts:
                ts = r.ts
                lines = by_path.setdefault(self.path_for(ts), [])
            lines.append(r.to_line())
        for path, lines in by_path.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as f:
                f.write("".join(lines))


_GAUGE_SPECS = (
    ("segment_broker_msg_rate_in", "Messages per second written to the segment (60 s window)"),
    ("segment_broker_bytes_rate_in", "Bytes per second written to the segment (60 s window)"),
    ("segment_broker_msg_rate_out", "Messages per second dispatched from the segment (60 s)"),
    ("segment_broker_bytes_rate_out", "Bytes per second dispatched from the segment (60 s)"),
)
_LABELS = ("namespace", "topic", "segment")
_families_by_registry: weakref.WeakKeyDictionary[
    CollectorRegistry, tuple[tuple[Gauge, Gauge, Gauge, Gauge], Counter]
] = weakref.WeakKeyDictionary()


def _families(registry: CollectorRegistry) -> tuple[tuple[Gauge, Gauge, Gauge, Gauge], Counter]:
    """One set of the tracker's metric families per registry: several trackers may share the
    process registry."""
    found = _families_by_registry.get(registry)
    if found is None:
        g = [Gauge(name, doc, _LABELS, registry=registry) for name, doc in _GAUGE_SPECS]
        samples = Counter(
            "segment_broker_load_samples_total",
            "Load sampling passes finished: every segment's rates sampled, the history "
            "appended and the Segment.status reports written or found unchanged",
            registry=registry,
        )
        found = ((g[0], g[1], g[2], g[3]), samples)
        _families_by_registry[registry] = found
    return found


class LoadTracker:
    """Owns the `SegmentLoad`s of a broker and samples them every `interval` seconds."""

    def __init__(
        self,
        reporter: LoadReporter,
        history: HistorySink | None,
        *,
        clock: Callable[[], float] = time.time,
        window: float = 60.0,
        interval: float = 10.0,
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        if interval <= 0 or window < interval:
            raise ValueError("need 0 < interval <= window")
        self.reporter = reporter
        self.history = history
        self.clock = clock
        self.window = window
        self.interval = interval
        self._buckets = max(1, round(window / interval))
        self._segments: dict[SegmentKey, SegmentLoad] = {}
        self._gauges, self._samples = _families(registry)
        self._exported: dict[SegmentKey, tuple[float, float, float, float]] = {}
        """The rates each segment's gauges hold: an idle segment's are not set again."""

    def segment(
        self,
        namespace: str,
        topic: str,
        segment_id: int,
        descriptor: str,
        hash_range: tuple[int, int],
    ) -> SegmentLoad:
        """The load of a segment, created on first use (idempotent for the same segment)."""
        key = (namespace, topic, segment_id)
        found = self._segments.get(key)
        if found is None:
            found = SegmentLoad(
                namespace,
                topic,
                segment_id,
                descriptor,
                hash_range,
                created_at=self.clock(),
                buckets=self._buckets,
            )
            self._segments[key] = found
        return found

    def zero_recorded(
        self, namespace: str, topic: str, segment_id: int, subscriptions: Iterable[str]
    ) -> None:
        """A segment just created empty, whose zero load the operator records itself (see
        :class:`RecordedZeroReporter`); a reporter that keeps no reference ignores it."""
        if isinstance(self.reporter, RecordedZeroReporter):
            self.reporter.zero_recorded(namespace, topic, segment_id, subscriptions)

    def remove(self, namespace: str, topic: str, segment_id: int) -> None:
        """Stop tracking a deleted segment and drop its gauge series and reporter state."""
        if self._segments.pop((namespace, topic, segment_id), None) is None:
            return
        self._exported.pop((namespace, topic, segment_id), None)
        for g in self._gauges:
            with contextlib.suppress(KeyError):
                g.remove(namespace, topic, str(segment_id))
        if isinstance(self.reporter, ForgettingReporter):
            self.reporter.forget(namespace, topic, segment_id)

    def __len__(self) -> int:
        return len(self._segments)

    def tick(self, now: float) -> list[LoadRecord]:
        """Close every segment's bucket at `now` and return one record per segment."""
        out = []
        for seg in self._segments.values():
            rates, messages_in, hist = seg.close_bucket(now)
            out.append(
                LoadRecord(
                    ts=now,
                    namespace=seg.namespace,
                    topic=seg.topic,
                    segment_id=seg.segment_id,
                    descriptor=seg.descriptor,
                    range_start=seg.range_start,
                    range_end=seg.range_end,
                    rates=rates,
                    messages_in=messages_in,
                    key_hist=hist,
                    backlog=seg.backlog_source() if seg.backlog_source is not None else {},
                )
            )
        return out

    def export(self, records: Iterable[LoadRecord]) -> None:
        """Set the Prometheus gauges from the records, where a segment's rates moved (a label
        lookup per gauge and segment made 7,000 idle segments a tenth of a core)."""
        for r in records:
            key = (r.namespace, r.topic, r.segment_id)
            values = r.rates.as_tuple()
            if self._exported.get(key) == values:
                continue
            self._exported[key] = values
            labels = (r.namespace, r.topic, str(r.segment_id))
            for g, v in zip(self._gauges, values, strict=True):
                g.labels(*labels).set(v)

    async def publish(self, records: list[LoadRecord]) -> None:
        """Export gauges, append the history (in a thread) and report every segment (its rates,
        and its backlog to a `BacklogReporter`).

        A failing history write or reporter write is logged and does not stop the others: the
        next interval brings a fresh sample anyway.
        """
        self.export(records)
        if self.history is not None and records:
            try:
                await asyncio.to_thread(self.history.write, records)
            except OSError:
                log.exception("load history write failed")
        # Asked once per step, not per segment: ``isinstance`` against a runtime-checkable
        # protocol walks the protocol's attributes each time (half of an idle step's CPU).
        reporter = self.reporter
        status_reporter = reporter if isinstance(reporter, StatusReporter) else None
        backlog_reporter = reporter if isinstance(reporter, BacklogReporter) else None
        for r in records:
            if (r.namespace, r.topic, r.segment_id) not in self._segments:
                continue  # removed while the previous writes were in flight
            if status_reporter is not None:
                try:
                    await status_reporter.write_status(
                        r.namespace, r.topic, r.segment_id, r.rates, r.backlog
                    )
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception(
                        "status report for %s/%s/%d failed", r.namespace, r.topic, r.segment_id
                    )
                continue
            try:
                await reporter.write(r.namespace, r.topic, r.segment_id, r.rates)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("load report for %s/%s/%d failed", r.namespace, r.topic, r.segment_id)
            if (
                backlog_reporter is None
                or (r.namespace, r.topic, r.segment_id) not in self._segments
            ):
                continue
            try:
                await backlog_reporter.write_backlog(r.namespace, r.topic, r.segment_id, r.backlog)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "backlog report for %s/%s/%d failed", r.namespace, r.topic, r.segment_id
                )

    async def step(self) -> list[LoadRecord]:
        """One sampling step at `clock()`: tick, then publish."""
        records = self.tick(self.clock())
        await self.publish(records)
        self._samples.inc()
        return records

    async def run(self, stop: asyncio.Event) -> None:
        """Sample every `interval` seconds until `stop` is set.

        Deadlines advance on a fixed grid from the start, so a slow step does not drift the
        cadence; a step that overran a whole interval skips the missed deadlines.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.interval
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, deadline - loop.time()))
                return
            except TimeoutError:
                pass
            await self.step()
            deadline += self.interval
            now = loop.time()
            if deadline <= now:
                deadline = now + self.interval

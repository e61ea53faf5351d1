"""All segments hosted by one broker process, keyed by ``(namespace, topic, segment id)``."""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalable_topics.core import wire
from scalable_topics.core.subscriptions import BrokerSubscriptionType

from .corruption import CorruptionReporter, CorruptionStatus
from .dispatch import Dispatcher
from .load import LoadTracker, SegmentLoad
from .metrics import BrokerMetrics
from .storage.fsutil import atomic_write_json, fsync_dir
from .storage.log import Corruption, TruncateReport
from .storage.segment import Retention, Segment, SegmentMeta, StorageSettings

log = logging.getLogger(__name__)

NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
SEGMENT_KEY = tuple[str, str, int]
MAX_BUCKETS = 1024
RATE_SAMPLES = 11
SAMPLE_SECONDS = 1.0
MIN_CACHE_BYTES = 1024 * 1024
QUARANTINE_FILE = "quarantined.json"
"""Next to a quarantined segment's log: a later start that finds it intact (a truncate, or a
good copy of the file put back) clears ``Segment.status.corruption``."""


class ConflictError(Exception):
    """The request contradicts the segment's existing, immutable settings."""


class NotFoundError(Exception):
    pass


def _marker_written(name: str, fut: asyncio.Future[None]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("%s: writing %s failed: %s", name, QUARANTINE_FILE, fut.exception())


def _forget_quarantine(directory: Path) -> bool:
    """Remove the quarantine marker; True when there was one."""
    path = directory / QUARANTINE_FILE
    if not path.exists():
        return False
    path.unlink()
    fsync_dir(directory)
    return True


def validate_name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not NAME.match(value) or ".." in value:
        raise ValueError(f"invalid {kind} {value!r} (lower-case DNS name expected)")
    return value


@dataclass
class HostedSegment:
    segment: Segment
    dispatchers: dict[str, Dispatcher] = field(default_factory=dict)
    load: SegmentLoad | None = None
    connections: set[Any] = field(default_factory=set)
    """Open WebSocket handlers (closed when the segment is deleted)."""
    producers: dict[str, Any] = field(default_factory=dict)
    """Producer name -> its (single) open produce connection."""
    samples: deque[tuple[float, int, int, int, int]] = field(
        default_factory=lambda: deque(maxlen=RATE_SAMPLES)
    )
    on_traffic: Callable[[], None] | None = None
    """Called when messages are dispatched (the store's durability callback sees the writes):
    the store samples the segment every second again."""

    def sample(self, now: float) -> bool:
        """Take the second's sample; whether the rates window still moves (``False``: every
        sample is the same, and the segment rests until its next traffic).

        A segment that rested has no samples for the seconds it rested. Its counters did not
        change then, so its window is filled with what those samples would have been, and its
        rates are over the same ten seconds as a segment sampled every second."""
        seg = self.segment
        counters = (seg.messages_in, seg.bytes_in, seg.messages_out, seg.bytes_out)
        samples = self.samples
        if samples and now - samples[-1][0] > 1.5 * SAMPLE_SECONDS:
            start = samples[0][0]
            _, mi, bi, mo, bo = samples[-1]
            samples.clear()
            for k in range(RATE_SAMPLES - 1, 0, -1):
                samples.append((max(start, now - k * SAMPLE_SECONDS), mi, bi, mo, bo))
        samples.append((now, *counters))
        return samples[0][1:] != counters

    def rates(self) -> dict[str, float]:
        """Per-second rates over the last ``RATE_SAMPLES`` seconds (for stats; the load
        reporter keeps its own 60 s window)."""
        if len(self.samples) < 2:
            return {"msgRateIn": 0.0, "bytesRateIn": 0.0, "msgRateOut": 0.0, "bytesRateOut": 0.0}
        t0, *first = self.samples[0]
        t1, *last = self.samples[-1]
        span = max(t1 - t0, 1e-9)
        mi, bi, mo, bo = ((b - a) / span for a, b in zip(first, last, strict=True))
        return {"msgRateIn": mi, "bytesRateIn": bi, "msgRateOut": mo, "bytesRateOut": bo}

    def backlog(self) -> dict[str, int]:
        """Entries written and not acknowledged, per subscription."""
        return {name: self.segment.backlog(d.cursor) for name, d in self.dispatchers.items()}

    def announce_sealing(self, successors: list[wire.Successor]) -> int:
        """Tell the producers (version 5) the successors ahead of the seal (when the controller
        has created them, and again as the seal begins): they connect to them before
        ``SEALED`` instead of after it (the connection handshake was most of a key's blocked
        window). Returns how many producers were told."""
        if not successors:
            return 0
        frame = wire.encode_sealing(successors)
        told = 0
        for conn in self.producers.values():
            if conn.version >= 5:
                conn.send(frame)
                told += 1
        return told

    def add_dispatcher(self, name: str) -> Dispatcher:
        cursor = self.segment.cursors[name]
        load = self.load
        on_traffic = self.on_traffic

        def on_out(messages: int, nbytes: int) -> None:
            if on_traffic is not None:
                on_traffic()
            if load is not None:
                load.record_out(messages, nbytes)

        disp = Dispatcher(self.segment, cursor, on_out=on_out)
        self.dispatchers[name] = disp
        self.segment.listeners.add(disp.on_durable)
        self.segment.seal_listeners.add(disp.schedule)
        return disp

    def remove_dispatcher(self, name: str) -> Dispatcher | None:
        disp = self.dispatchers.pop(name, None)
        if disp is not None:
            disp.close()
            self.segment.listeners.discard(disp.on_durable)
            self.segment.seal_listeners.discard(disp.schedule)
        return disp


class SegmentStore:
    def __init__(
        self,
        data_dir: Path,
        settings: StorageSettings,
        metrics: BrokerMetrics,
        tracker: LoadTracker | None = None,
        corruption_reporter: CorruptionReporter | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.settings = settings
        self.metrics = metrics
        self.tracker = tracker
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="segment-io")
        self.segments: dict[SEGMENT_KEY, HostedSegment] = {}
        self._by_topic: dict[tuple[str, str], dict[int, HostedSegment]] = {}
        """The same segments per ``(namespace, topic)``: a topic's listing does not scan them
        all (the controller asks for one topic's at every new topic's first reconcile)."""
        self._shared_among = 0
        """How many segments the cache budget was last split among (:meth:`_share_cache`)."""
        self._locks: dict[SEGMENT_KEY, asyncio.Lock] = {}
        self._sampler: asyncio.Task[None] | None = None
        self._housekeeper: asyncio.Task[None] | None = None
        self._due: set[Segment] = set()
        self._rolled: set[Segment] = set()
        """Segments with more than one log file: the ones time retention may act on."""
        self._moving: set[SEGMENT_KEY] = set()
        """Segments with traffic in the last ten seconds: the ones sampled every second."""
        self.unrecoverable: dict[str, str] = {}
        self.quarantined: dict[SEGMENT_KEY, HostedSegment] = {}
        """The hosted segments found corrupted (a truncate hosts the segment anew)."""
        self.cache_budget = settings.cache_bytes
        self.corruption_status = (
            CorruptionStatus(corruption_reporter) if corruption_reporter is not None else None
        )

    async def _sample_loop(self) -> None:
        """Every second a sample of the segments with traffic in their rates window (the
        others rest: :meth:`HostedSegment.sample`). Sampling every segment every second was a
        sixth of an idle broker's CPU at 7,000 segments."""
        while True:
            now = time.monotonic()
            moving = self._moving
            for key in list(moving):
                hosted = self.segments.get(key)
                if hosted is None or not hosted.sample(now):
                    moving.discard(key)
            await asyncio.sleep(SAMPLE_SECONDS)

    async def _housekeeping_loop(self) -> None:
        """Every ``cursor_flush_ms`` the segments that became due (a cursor changed, the log
        rolled), and once a second every segment with a rolled file (time retention of idle
        ones): changed cursors persisted and retention applied, in the background
        (:meth:`Segment.housekeep`).

        Retention only ever deletes rolled files, so a segment with one file waits for its
        roll, which makes it due. (Once a second over every segment was a third of an idle
        broker's CPU: 7,000 segments, bench/README.md, operator, twelfth round.)"""
        period = self.settings.cursor_flush_ms / 1000.0
        every = max(1, round(1.0 / period))
        tick = 0
        while True:
            await asyncio.sleep(period)
            tick += 1
            # Emptied in place: every segment's ``on_due`` is this set's ``add``.
            due = set(self._due)
            self._due.clear()
            rolled = self._rolled
            rolled.update(s for s in due if len(s.log.files) > 1)
            if tick % every == 0:
                rolled.difference_update([s for s in rolled if s.closed or len(s.log.files) < 2])
                due |= rolled
            for segment in due:
                segment.housekeep()

    def __iter__(self) -> Iterator[HostedSegment]:
        return iter(list(self.segments.values()))

    def of_topic(self, namespace: str, topic: str) -> list[HostedSegment]:
        return list(self._by_topic.get((namespace, topic), {}).values())

    def _index(self, key: SEGMENT_KEY, hosted: HostedSegment) -> None:
        self.segments[key] = hosted
        self._by_topic.setdefault(key[:2], {})[key[2]] = hosted
        self._share_cache(hosted)

    def _unindex(self, key: SEGMENT_KEY) -> HostedSegment | None:
        hosted = self.segments.pop(key, None)
        self.quarantined.pop(key, None)
        if hosted is not None:
            of_topic = self._by_topic[key[:2]]
            del of_topic[key[2]]
            if not of_topic:
                del self._by_topic[key[:2]]
            self._share_cache()
        return hosted

    def _lock(self, key: SEGMENT_KEY) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def _segment_dir(self, meta: SegmentMeta) -> Path:
        return self.data_dir / meta.namespace / meta.topic / meta.descriptor

    async def open(self) -> None:
        """Recover every segment found under the data directory."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        metas = await asyncio.get_running_loop().run_in_executor(self.executor, self._scan)
        for directory, meta in metas:
            try:
                await self._host(directory, meta)
            except (OSError, ValueError, KeyError, RuntimeError) as exc:
                # One damaged segment must not keep the others offline; it stays unhosted
                # (clients get SegmentNotFound) until an operator repairs or deletes it.
                log.error("segment %s cannot be recovered and is not served: %s", directory, exc)
                self.unrecoverable[str(directory)] = str(exc)
        await self._open_children_of_seals()
        log.info("recovered %d segments from %s", len(metas), self.data_dir)
        self._sampler = asyncio.get_running_loop().create_task(self._sample_loop())
        self._housekeeper = asyncio.get_running_loop().create_task(self._housekeeping_loop())

    def _scan(self) -> list[tuple[Path, SegmentMeta]]:
        import json

        found = []
        for meta_path in sorted(self.data_dir.glob("*/*/*/segment.json")):
            try:
                meta = SegmentMeta.from_json(json.loads(meta_path.read_bytes()))
            except (OSError, ValueError, KeyError, TypeError):
                log.exception("unreadable segment identity %s; skipped", meta_path)
                continue
            found.append((meta_path.parent, meta))
        return found

    async def _host(self, directory: Path, meta: SegmentMeta) -> HostedSegment:
        load: SegmentLoad | None = None
        if self.tracker is not None:
            load = self.tracker.segment(
                meta.namespace,
                meta.topic,
                meta.segment_id,
                meta.descriptor,
                (meta.range_start, meta.range_end),
            )

        key = (meta.namespace, meta.topic, meta.segment_id)
        moving = self._moving

        def on_traffic() -> None:
            moving.add(key)

        def on_durable(entries: list[tuple[int, int, int | None]]) -> None:
            moving.add(key)
            if load is not None:
                record = load.record_in
                for count, nbytes, sample in entries:
                    record(count, nbytes, sample)

        seg = Segment(
            directory,
            meta,
            self.settings,
            self.executor,
            on_fsync=self.metrics.fsync_seconds.observe,
            on_stage=self.metrics.observe_stage,
            on_durable_entries=on_durable,
        )
        seg.on_due = self._due.add
        report = await seg.open()
        if len(seg.log.files) > 1:
            self._rolled.add(seg)
        if report.truncated_bytes:
            self.metrics.torn_tail_truncations.inc()
        hosted = HostedSegment(seg, load=load, on_traffic=on_traffic)
        hosted.sample(time.monotonic())
        if load is not None:
            load.backlog_source = hosted.backlog
        for name in seg.cursors:
            hosted.add_dispatcher(name)
        self._index(key, hosted)
        seg.corruption_listeners.add(functools.partial(self._quarantined, hosted))
        if report.corruption is not None:
            # The marker is on disk before the broker reports ready: a restart with a good
            # copy put back must find it to clear the Segment's status.
            await asyncio.wait([self._quarantined(hosted, report.corruption)])
        elif await asyncio.get_running_loop().run_in_executor(
            self.executor, _forget_quarantine, directory
        ):
            log.warning(
                "segment %s was quarantined and is intact now: it accepts appends again",
                seg.name,
                extra={"event": "segment_quarantine_lifted", "segment": seg.name},
            )
            if self.corruption_status is not None:
                self.corruption_status.set((meta.namespace, meta.topic, meta.segment_id), None)
        return hosted

    def _quarantined(self, hosted: HostedSegment, corruption: Corruption) -> asyncio.Future[None]:
        """Make a corrupted segment loud: ERROR log, metric, ``Segment.status.corruption``;
        consumers that reached the damage are told (see ``Dispatcher``). Returns the write of
        the quarantine marker (a failure is logged)."""
        seg = hosted.segment
        meta = seg.meta
        self.quarantined[(meta.namespace, meta.topic, meta.segment_id)] = hosted
        log.error(
            "segment %s is corrupted at position %d (%s offset %d: %s; found by %s): "
            "quarantined, appends, seal and retention refused, positions from %d on not served, "
            "its files kept as they are; docs/operations.md says how to recover",
            seg.name,
            corruption.position,
            corruption.file,
            corruption.offset,
            corruption.reason,
            corruption.source,
            corruption.position,
            extra={"event": "segment_corrupted", "segment": seg.name, **corruption.to_json()},
        )
        self.metrics.corruptions.labels(corruption.source).inc()
        for disp in hosted.dispatchers.values():
            disp.schedule()
        marker = asyncio.get_running_loop().run_in_executor(
            self.executor, atomic_write_json, seg.directory / QUARANTINE_FILE, corruption.to_json()
        )
        marker.add_done_callback(functools.partial(_marker_written, seg.name))
        if self.corruption_status is not None:
            self.corruption_status.set(
                (meta.namespace, meta.topic, meta.segment_id), corruption.to_json()
            )
        return marker

    async def truncate(
        self, namespace: str, topic: str, segment_id: int, position: int, acknowledge_loss: str
    ) -> tuple[HostedSegment, TruncateReport]:
        """An operator's way out of a quarantine: cut the corrupted segment's log at the
        damaged position, losing every entry from there on, and serve it again. The loss must
        be acknowledged by naming the segment (``<namespace>/<topic>/<id>``); ``position`` must
        be the one the quarantine reports (so a stale request cannot cut elsewhere)."""
        name = f"{namespace}/{topic}/{segment_id}"
        if acknowledge_loss != name:
            raise ValueError(
                f"acknowledgeLoss must name the segment whose entries are lost: {name!r}"
            )
        key = (namespace, topic, segment_id)
        async with self._lock(key):
            hosted = self.get(namespace, topic, segment_id)
            seg = hosted.segment
            corruption = seg.corruption
            if corruption is None:
                raise ConflictError(f"segment {name} is not corrupted; nothing to truncate")
            if position != corruption.position:
                raise ConflictError(
                    f"segment {name} is corrupted at position {corruption.position}, not "
                    f"{position}; truncate it there"
                )
            self._unindex(key)
            for sub in list(hosted.dispatchers):
                hosted.remove_dispatcher(sub)
            for conn in list(hosted.connections):
                conn.close_soon("GoingAway", "segment truncated", wire.CLOSE_GOING_AWAY)
            try:
                report = await seg.truncate(position)
            finally:
                # Served again in any case: cut and healthy, or still quarantined if the
                # truncation failed half-way (it can be repeated).
                hosted = await self._host(seg.directory, seg.meta)
            lost = corruption.to_json()
            log.warning(
                "segment %s truncated at position %d by an operator who acknowledged the loss: "
                "%d bytes and %d later file(s) removed; it accepts appends again",
                name,
                position,
                report.dropped_bytes,
                len(report.dropped_files),
                extra={
                    "event": "segment_truncated",
                    "segment": seg.name,
                    "droppedBytes": report.dropped_bytes,
                    "droppedFiles": report.dropped_files,
                    "corruption": lost,
                },
            )
            self.metrics.corruption_truncations.inc()
            return hosted, report

    def _share_cache(self, added: HostedSegment | None = None) -> None:
        """Split the process-wide cache budget evenly among the hosted segments. Every segment
        is re-limited only when their number moved by an eighth since the last split (so
        opening N segments costs O(N), not O(N²)); in between, a new segment gets the current
        share, and the budget is overshot by at most an eighth."""
        n = len(self.segments)
        share = max(MIN_CACHE_BYTES, self.cache_budget // max(1, n))
        if abs(n - self._shared_among) * 8 <= self._shared_among:
            if added is not None:
                added.segment.cache_limit = share
            return
        self._shared_among = n
        for hosted in self.segments.values():
            hosted.segment.cache_limit = share

    def get(self, namespace: str, topic: str, segment_id: int) -> HostedSegment:
        hosted = self.segments.get((namespace, topic, segment_id))
        if hosted is None:
            raise NotFoundError(f"segment {namespace}/{topic}/{segment_id} is not hosted here")
        return hosted

    async def create(
        self,
        namespace: str,
        topic: str,
        segment_id: int,
        range_start: int,
        range_end: int,
        buckets: int,
        subscriptions: dict[str, BrokerSubscriptionType],
        retention: Retention,
        *,
        writable: bool = True,
        zero_load_recorded: bool = False,
    ) -> tuple[HostedSegment, bool]:
        """Create a segment with its cursors at position 0. Idempotent: the same request on an
        existing segment returns it (adding missing subscriptions); a different range or bucket
        count is a conflict. Returns ``(segment, created)``.

        ``writable=False`` creates it fenced: produce is refused until :meth:`activate`. An
        existing segment's fence is never changed by a create (only activation lifts it).

        ``zero_load_recorded``: the caller records the new segment's zero load itself, so the
        load reporter takes zero as already written (ignored for a segment that exists: it may
        have had traffic)."""
        validate_name("namespace", namespace)
        validate_name("topic", topic)
        if not isinstance(segment_id, int) or isinstance(segment_id, bool) or segment_id < 0:
            raise ValueError("segmentId must be a non-negative integer")
        if not 0 <= range_start <= range_end <= 0xFFFF:
            raise ValueError(f"invalid hash range [{range_start}, {range_end}]")
        if not 1 <= buckets <= MAX_BUCKETS:
            raise ValueError(f"buckets must be within 1..{MAX_BUCKETS}")
        key = (namespace, topic, segment_id)
        async with self._lock(key):
            hosted = self.segments.get(key)
            if hosted is not None:
                meta = hosted.segment.meta
                if (meta.range_start, meta.range_end, meta.buckets) != (
                    range_start,
                    range_end,
                    buckets,
                ):
                    raise ConflictError(
                        f"segment {namespace}/{topic}/{segment_id} exists as {meta.descriptor} "
                        f"with {meta.buckets} buckets"
                    )
                for name, sub_type in subscriptions.items():
                    await self.create_subscription(hosted, name, sub_type, at_end=False)
                return hosted, False
            meta = SegmentMeta(
                namespace=namespace,
                topic=topic,
                segment_id=segment_id,
                range_start=range_start,
                range_end=range_end,
                buckets=buckets,
                created_at=time.time(),
                retention=retention,
            )
            directory = self._segment_dir(meta)
            await asyncio.get_running_loop().run_in_executor(
                self.executor,
                functools.partial(
                    Segment.create_blocking,
                    directory,
                    meta,
                    {n: t.value for n, t in subscriptions.items()},
                    writable=writable,
                ),
            )
            hosted = await self._host(directory, meta)
            if zero_load_recorded and self.tracker is not None:
                self.tracker.zero_recorded(namespace, topic, segment_id, subscriptions)
            return hosted, True

    async def activate(
        self, namespace: str, topic: str, segment_id: int, *, durable: bool = True
    ) -> HostedSegment:
        """Lift a segment's fence (idempotent; ``durable``: see ``Segment.activate``)."""
        async with self._lock((namespace, topic, segment_id)):
            hosted = self.get(namespace, topic, segment_id)
            await hosted.segment.activate(durable=durable)
            return hosted

    async def _open_children_of_seals(self) -> None:
        """Open the children a seal here opened (``SealInfo.open``) that are still fenced:
        their marker's removal had not reached the disk when the broker stopped. A child
        fenced for a transfer since has a reason on its marker and is left alone."""
        for hosted in list(self.segments.values()):
            seal = hosted.segment.seal
            if seal is None or not seal.open:
                continue
            meta = hosted.segment.meta
            for sid in seal.open:
                child = self.segments.get((meta.namespace, meta.topic, sid))
                if child is None or child.segment.writable or child.segment.fence_reason:
                    continue
                await child.segment.activate()
                log.info(
                    "segment %s: opened on recovery, as the seal of %s had named it",
                    child.segment.name,
                    hosted.segment.name,
                )

    async def create_subscription(
        self, hosted: HostedSegment, name: str, sub_type: BrokerSubscriptionType, *, at_end: bool
    ) -> bool:
        seg = hosted.segment
        existed = name in seg.cursors
        await seg.add_cursor(name, sub_type, at_end)
        if name not in hosted.dispatchers:
            hosted.add_dispatcher(name)
        return not existed

    async def delete_subscription(self, hosted: HostedSegment, name: str) -> bool:
        disp = hosted.remove_dispatcher(name)
        if disp is not None:
            for c in list(disp.consumers):
                close = getattr(c.sink, "close_soon", None)
                if close is not None:
                    close("SubscriptionNotFound", "subscription deleted")
        return await hosted.segment.remove_cursor(name)

    async def delete(self, namespace: str, topic: str, segment_id: int) -> bool:
        key = (namespace, topic, segment_id)
        async with self._lock(key):
            hosted = self._unindex(key)
            if hosted is None:
                return False
            for name in list(hosted.dispatchers):
                hosted.remove_dispatcher(name)
            for conn in list(hosted.connections):
                conn.close_soon("SegmentDeleted", "segment deleted")
            await hosted.segment.destroy()
            if self.tracker is not None:
                self.tracker.remove(namespace, topic, segment_id)
            return True

    async def close(self) -> None:
        for task in (self._sampler, self._housekeeper):
            if task is not None:
                task.cancel()
        if self.corruption_status is not None:
            await self.corruption_status.close()
        for hosted in list(self.segments.values()):
            for disp in hosted.dispatchers.values():
                disp.close()
            try:
                await hosted.segment.close()
            except Exception:
                log.exception("closing %s failed", hosted.segment.name)
        self.executor.shutdown(wait=True)

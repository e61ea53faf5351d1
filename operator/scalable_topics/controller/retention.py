"""Retention and controller-observed drains (docs/operator.md, "Retention and drains"): the
leader reads the stats of sealed segments from their brokers (few, and at most once per stats
round), feeds the drains it sees to the consumer hub, and prunes from the DAG the sealed
segments that every subscription drained and retention lets go (``core.retention``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..brokeradmin import AdminError
from ..core.jsontypes import JsonObj
from ..core.layout import SegmentInfo, SegmentLayout
from ..core.policy import format_duration
from ..core.resources import ScalableTopicSpec, ScalableTopicStatus, parse_time
from ..core.retention import RetentionRule, SegmentDrains, drains_from_stats, next_expiry, prunable
from ..core.topicstatus import layout_from, with_layout
from . import metrics
from .brokers import BrokerAdmin
from .cache import TopicCache, layout_of
from .kube import KubeApi
from .protocol import EventSink
from .segments import SegmentKeeper
from .status import change_topic_status

log = logging.getLogger(__name__)

Key = tuple[str, str]

STATS_CONCURRENCY = 8
"""Broker stats calls one reconcile pass makes at once (drain and retention checks)."""


@dataclass(frozen=True)
class _Observed:
    """The last broker stats of a sealed segment: ``round`` is the stats round they were read
    in, ``drains`` is ``None`` when the broker could not say (unreachable, or no such segment).
    A sealed segment's drains only grow, so a fully drained observation is kept for good."""

    round: int
    drains: SegmentDrains | None


class RetentionKeeper:
    """The reconciler's retention collaborator (one per replica)."""

    def __init__(
        self,
        kube: KubeApi,
        brokers: BrokerAdmin,
        cache: TopicCache,
        segments: SegmentKeeper,
        *,
        events: EventSink,
        on_drained: Callable[[str, str, str, int], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.brokers = brokers
        self.cache = cache
        self.segments = segments
        self.events = events
        self.on_drained = on_drained
        """Called with (namespace, topic, subscription, segment id) for a drain seen in broker
        stats: the consumer hub's ``segment_drained``."""
        self.clock = clock
        self.stats_round = 0
        self._observed: dict[Key, dict[int, _Observed]] = {}

    def new_stats_round(self) -> None:
        """Start a stats round (the resync loop calls it once per resync interval): a sealed
        segment's broker is asked for its stats at most once per round."""
        self.stats_round += 1

    def forget(self, key: Key) -> None:
        self._observed.pop(key, None)

    async def retain(
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
        await self.events(
            topic,
            "Normal",
            "Pruned",
            f"pruned {segments} from the DAG (epoch {layout.epoch}): sealed, drained by every "
            f"subscription, {_describe_retention(retention)}",
        )
        await self.segments.remove_orphans(topic, layout)
        return topic, layout


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

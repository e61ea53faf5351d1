"""The Segments of a topic's layout (docs/operator.md, "Segments"): every segment of the DAG
exists where it should, with the spec's subscriptions and its layout epochs recorded; a Segment
lost with its resource is recovered from its broker before anything is placed afresh; segments
pruned from the DAG are deleted from their brokers, then as resources.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..brokeradmin import AdminError
from ..core.buckets import initial_layout_buckets, layout_buckets
from ..core.jsontypes import JsonObj
from ..core.layout import SegmentInfo, SegmentLayout
from ..core.rebuild import one_report_each, orphans
from ..core.resources import ScalableTopicSpec, format_time, segment_name
from ..core.transfer import recorded_broker
from .brokers import BrokerAdmin
from .cache import TopicCache
from .faults import crash_after, fault_point
from .kube import KubeApi
from .protocol import EventSink, OperationExecutor
from .restore import BrokersUnanswered, broker_reports, write_missing_segments

log = logging.getLogger(__name__)

Key = tuple[str, str]

CREATION_FAULT_POINTS = ("first-segment-placed", "segments-placed")
"""Where a new topic's pass can be made to crash (``controller.faults``): after its first
segment is on its broker, and after all of them are, before the Ready write that records the
layout (tests/integration/test_operator_crash.py)."""


class SegmentsUnavailable(Exception):
    def __init__(self, segments: list[int], detail: str) -> None:
        super().__init__(f"segments {segments} are not on a broker yet: {detail}")
        self.segments = segments


class SegmentKeeper:
    """The reconciler's Segments collaborator (one per replica)."""

    def __init__(
        self,
        kube: KubeApi,
        brokers: BrokerAdmin,
        cache: TopicCache,
        executor: OperationExecutor,
        *,
        events: EventSink,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.brokers = brokers
        self.cache = cache
        self.executor = executor
        self.events = events
        self.clock = clock
        self._leftovers: dict[Key, list[int]] = {}
        """Segments pruned from the DAG whose broker pod is away (deleted on a later pass)."""
        self._unknown: dict[Key, tuple[int, ...]] = {}
        """Segments outside the layout that it never handed out (kept), as last logged."""
        self.fault = fault_point(CREATION_FAULT_POINTS)

    def forget(self, key: Key) -> None:
        self._leftovers.pop(key, None)
        self._unknown.pop(key, None)

    def leftovers(self, key: Key) -> list[int]:
        """Pruned segments still waiting for their broker pod (``Reconciling`` says so)."""
        return list(self._leftovers.get(key, []))

    def bucket_counts(
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

    async def ensure(
        self,
        topic: JsonObj,
        layout: SegmentLayout,
        spec: ScalableTopicSpec,
        *,
        new: bool = False,
    ) -> None:
        """Every segment of the layout exists where it should (Active on its broker, with the
        spec's subscriptions) or is marked Sealed; segments no longer in the DAG are deleted
        from their brokers and then as resources. A segment of the layout whose Segment is gone
        is looked for on the brokers first (not for a ``new`` topic, whose first layout this
        pass wrote: it has nothing anywhere), so that it is never placed afresh, empty, away
        from its data. A ``new`` topic's placements are told in its ``Created`` event."""
        recover = not new
        ns, name = topic["metadata"]["namespace"], topic["metadata"]["name"]
        subscriptions = sorted((s.name, s.type.value) for s in spec.subscriptions)
        wanted = {s for s, _ in subscriptions}
        looked: set[int] = set()
        """Segments this pass already looked for on the brokers (not placed afresh again)."""
        # Not for a topic just created: its pass has listed its Segments moments ago (none),
        # and a label-selected list scans the namespace's every Segment at the API server
        # (at 10,000 topics, 20,000 Segments per new topic). Creating a Segment is idempotent.
        if recover and any(sid not in self._segments_of(ns, name) for sid in layout.segments):
            for body in await self.kube.list_segments(ns, name):
                self.cache.put_segment(body)
            existing = self._segments_of(ns, name)
            missing = [sid for sid in sorted(layout.segments) if sid not in existing]
            if missing:
                await self._recover_segments(topic, layout, missing)
            looked.update(missing)
        # After the listing: once roots were pruned, bucket counts come from the Segments.
        buckets = self.bucket_counts(topic, layout, spec)
        pending: list[int] = []
        failures: list[str] = []
        placed: list[str] = []
        try:
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
                                epochs=layout_epochs(info),
                                placed=placed,
                            )
                        except AdminError as exc:
                            pending.append(info.segment_id)
                            failures.append(str(exc))
                            continue
                        if new:
                            crash_after(self.fault, "first-segment-placed")
                    elif set(status.get("subscriptions") or []) != wanted:
                        await self._sync_subscriptions(
                            topic, info.segment_id, status, subscriptions
                        )
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
        finally:
            await self.executor.announce_placed(topic, placed, created=layout if new else None)
        if failures:
            raise SegmentsUnavailable(pending, "; ".join(failures))
        if new:
            crash_after(self.fault, "segments-placed")
        await self.remove_orphans(topic, layout)

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
        await self.events(
            topic,
            "Warning",
            "SegmentsRecovered",
            f"Segments written again from their brokers: {where}",
        )

    async def _record_epochs(self, ns: str, name: str, info: SegmentInfo, seg: JsonObj) -> None:
        """Keep the layout's epochs of the segment on its Segment: a lost layout is rebuilt from
        the Segments, with an epoch above every recorded one (``core.rebuild``)."""
        status = seg.get("status") or {}
        wanted = layout_epochs(info)
        if all(status.get(k) == v for k, v in wanted.items()):
            return
        updated = await self.kube.patch_segment_status(
            ns, segment_name(name, info.segment_id), wanted
        )
        self.cache.put_segment(updated)

    async def remove_orphans(self, topic: JsonObj, layout: SegmentLayout) -> None:
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


def layout_epochs(info: SegmentInfo) -> dict[str, Any]:
    """The layout's epochs of a segment, as its Segment's status records them."""
    return {"createdAtEpoch": info.created_at_epoch, "sealedAtEpoch": info.sealed_at_epoch or None}

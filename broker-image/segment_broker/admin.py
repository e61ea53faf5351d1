"""The broker's admin HTTP API (docs/protocol.md): create, inspect, seal, activate, truncate and
delete segments, and their subscriptions. Every route runs through :func:`.routes.run_admin`,
which answers each failure with its HTTP status; the auth check is the application's
middleware (:class:`.server.Broker`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from scalable_topics.core import wire
from scalable_topics.core.subscriptions import BrokerSubscriptionType

from .routes import hosted_segment, json_error, read_body, run_admin, segment_key
from .storage.segment import Retention
from .store import HostedSegment, NotFoundError, SegmentStore

log = logging.getLogger(__name__)


class AdminRoutes:
    """``/admin/v1/segments`` and the routes of one segment below it."""

    def __init__(self, store: SegmentStore) -> None:
        self.store = store

    def register(self, app: web.Application, base: str, segment_path: str) -> None:
        r = app.router
        seg = segment_path
        r.add_get(base, self.list_segments)
        r.add_put(seg, self.create_segment)
        r.add_get(seg, self.segment_stats)
        r.add_delete(seg, self.delete_segment)
        r.add_post(seg + "/terminate", self.terminate_segment)
        r.add_post(seg + "/activate", self.activate_segment)
        r.add_post(seg + "/successors", self.announce_successors)
        r.add_post(seg + "/truncate", self.truncate_segment)
        r.add_put(seg + "/subscriptions/{subscription}", self.create_subscription)
        r.add_delete(seg + "/subscriptions/{subscription}", self.delete_subscription)

    async def list_segments(self, request: web.Request) -> web.Response:
        """Every hosted segment, or with ``?namespace=…&topic=…`` one topic's (from an index:
        the controller asks at every new topic's first reconcile, and a listing of everything
        then made creating N topics cost O(N²))."""
        namespace, topic = request.query.get("namespace"), request.query.get("topic")
        if (namespace is None) != (topic is None):
            return json_error("BadRequest", "namespace and topic filter only together")
        hosted = (
            self.store.of_topic(namespace, topic)
            if namespace is not None and topic is not None
            else list(self.store)
        )
        return web.json_response({"segments": [_summary(h) for h in sorted(hosted, key=_sort_key)]})

    async def create_segment(self, request: web.Request) -> web.Response:
        async def action() -> web.Response:
            namespace, topic, sid = segment_key(request)
            body = await read_body(request)
            rng = body["range"]
            if not isinstance(rng, dict):
                raise ValueError("range must be an object {start, end}")
            start, end = _int(rng, "start"), _int(rng, "end")
            buckets = _int(body, "buckets", 1)
            writable = body.get("writable", True)
            if not isinstance(writable, bool):
                raise ValueError("writable must be a boolean")
            zero_load_recorded = body.get("zeroLoadRecorded", False)
            if not isinstance(zero_load_recorded, bool):
                raise ValueError("zeroLoadRecorded must be a boolean")
            subs: dict[str, BrokerSubscriptionType] = {}
            for item in body.get("subscriptions", []):
                if not isinstance(item, dict):
                    raise ValueError("subscriptions must be objects {name, type}")
                name = str(item["name"])
                _check_subscription_name(name)
                subs[name] = BrokerSubscriptionType.parse(str(item.get("type", "Exclusive")))
            retention = body.get("retention")
            if retention is not None and not isinstance(retention, dict):
                raise ValueError("retention must be an object {timeMs, sizeBytes}")
            hosted, created = await self.store.create(
                namespace,
                topic,
                sid,
                start,
                end,
                buckets,
                subs,
                Retention.from_json(retention),
                writable=writable,
                zero_load_recorded=zero_load_recorded,
            )
            return web.json_response(_stats(hosted), status=201 if created else 200)

        return await run_admin(request, action)

    async def segment_stats(self, request: web.Request) -> web.Response:
        async def action() -> web.Response:
            return web.json_response(_stats(hosted_segment(self.store, request)))

        return await run_admin(request, action)

    async def delete_segment(self, request: web.Request) -> web.Response:
        async def action() -> web.Response:
            namespace, topic, sid = segment_key(request)
            if not await self.store.delete(namespace, topic, sid):
                raise NotFoundError(f"segment {namespace}/{topic}/{sid} not found")
            return web.json_response({"deleted": True})

        return await run_admin(request, action)

    async def terminate_segment(self, request: web.Request) -> web.Response:
        async def action() -> web.Response:
            namespace, topic, _ = segment_key(request)
            hosted = hosted_segment(self.store, request)
            body = await read_body(request)
            successors = _successors(body)
            to_open = _successors_to_open(body, successors)
            self._check_openable(namespace, topic, to_open)
            seal = await hosted.segment.terminate(
                [s.to_json() for s in successors],
                open_after=to_open,
                on_begin=lambda: hosted.announce_sealing(successors),
            )
            done = await asyncio.gather(
                *(
                    self._open_after_seal(namespace, topic, sid, durable=sid not in seal.open)
                    for sid in to_open
                )
            )
            opened = [sid for sid, ok in zip(to_open, done, strict=True) if ok]
            return web.json_response({"sealed": True, **seal.to_json(), "opened": opened})

        return await run_admin(request, action)

    async def announce_successors(self, request: web.Request) -> web.Response:
        async def action() -> web.Response:
            hosted = hosted_segment(self.store, request)
            body = await read_body(request)
            successors = _successors(body)
            seg = hosted.segment
            told = 0
            if not (seg.sealed or seg.sealing or seg.corruption is not None):
                told = hosted.announce_sealing(successors)
            return web.json_response({"producersTold": told})

        return await run_admin(request, action)

    def _check_openable(self, namespace: str, topic: str, to_open: list[int]) -> None:
        """Before the seal: every successor to open is hosted here, fenced as a new child is
        (not by an ownership transfer, whose copy must never take writes from this route)."""
        for sid in to_open:
            hosted = self.store.segments.get((namespace, topic, sid))
            if hosted is None:
                raise ValueError(f"open names successor {sid}, which is not hosted on this broker")
            reason = hosted.segment.fence_reason
            if reason is not None:
                raise ValueError(f"open names successor {sid}, fenced for a transfer ({reason})")

    async def _open_after_seal(
        self, namespace: str, topic: str, segment_id: int, *, durable: bool
    ) -> bool:
        """Activate a successor the seal's caller named in ``open``; a failure leaves it fenced
        for the controller's own activation step (the seal stands either way). One the seal's
        marker names (``SealInfo.open``; not one a repeated call adds) is opened without a
        durable write of its own (``Segment.activate``)."""
        try:
            await self.store.activate(namespace, topic, segment_id, durable=durable)
        except (NotFoundError, OSError) as exc:
            log.warning(
                "%s/%s: successor %d not opened after the seal: %s",
                namespace,
                topic,
                segment_id,
                exc,
            )
            return False
        return True

    async def activate_segment(self, request: web.Request) -> web.Response:
        async def action() -> web.Response:
            hosted = await self.store.activate(*segment_key(request))
            return web.json_response(_summary(hosted))

        return await run_admin(request, action)

    async def truncate_segment(self, request: web.Request) -> web.Response:
        async def action() -> web.Response:
            body = await read_body(request)
            position = _int(body, "position")
            acknowledge = body.get("acknowledgeLoss")
            if not isinstance(acknowledge, str):
                raise ValueError("acknowledgeLoss must be the segment's <namespace>/<topic>/<id>")
            hosted, report = await self.store.truncate(*segment_key(request), position, acknowledge)
            return web.json_response(
                {
                    **_summary(hosted),
                    "truncated": {
                        "position": report.position,
                        "droppedBytes": report.dropped_bytes,
                        "droppedFiles": report.dropped_files,
                    },
                }
            )

        return await run_admin(request, action)

    async def create_subscription(self, request: web.Request) -> web.Response:
        async def action() -> web.Response:
            hosted = hosted_segment(self.store, request)
            body = await read_body(request)
            name = request.match_info["subscription"]
            _check_subscription_name(name)
            sub_type = BrokerSubscriptionType.parse(str(body.get("type", "Exclusive")))
            initial = str(body.get("initialPosition", "earliest")).lower()
            if initial not in ("earliest", "latest"):
                raise ValueError("initialPosition must be 'earliest' or 'latest'")
            created = await self.store.create_subscription(
                hosted, name, sub_type, at_end=initial == "latest"
            )
            disp = hosted.dispatchers[name]
            return web.json_response({"name": name, **disp.stats()}, status=201 if created else 200)

        return await run_admin(request, action)

    async def delete_subscription(self, request: web.Request) -> web.Response:
        async def action() -> web.Response:
            hosted = hosted_segment(self.store, request)
            name = request.match_info["subscription"]
            if not await self.store.delete_subscription(hosted, name):
                return json_error("SubscriptionNotFound", f"no subscription {name!r}")
            return web.json_response({"deleted": True})

        return await run_admin(request, action)


def _summary(hosted: HostedSegment) -> dict[str, Any]:
    seg = hosted.segment
    meta = seg.meta
    return {
        "namespace": meta.namespace,
        "topic": meta.topic,
        "segmentId": meta.segment_id,
        "descriptor": meta.descriptor,
        "range": {"start": meta.range_start, "end": meta.range_end},
        "buckets": meta.buckets,
        "sealed": seg.sealed,
        "writable": seg.writable,
        "lastPosition": seg.visible_position,
        "corruption": seg.corruption.to_json() if seg.corruption is not None else None,
    }


def _stats(hosted: HostedSegment) -> dict[str, Any]:
    seg = hosted.segment
    return {
        **_summary(hosted),
        "firstPosition": seg.log.first_position,
        "nextPosition": seg.log.next_position,
        "inFlight": seg.in_flight,
        "seal": seg.seal.to_json() if seg.seal is not None else None,
        "retention": seg.meta.retention.to_json(),
        "subscriptions": {n: d.stats() for n, d in sorted(hosted.dispatchers.items())},
        "counters": {
            "entriesIn": seg.entries_in,
            "messagesIn": seg.messages_in,
            "bytesIn": seg.bytes_in,
            "entriesOut": seg.entries_out,
            "messagesOut": seg.messages_out,
            "bytesOut": seg.bytes_out,
            "duplicates": seg.duplicates,
            "fsyncs": seg.fsyncs,
        },
        "rates": hosted.rates(),
        "log": {"files": len(seg.log.files), "bytes": seg.log.total_bytes},
        "producers": len(seg.producers),
    }


def _sort_key(h: HostedSegment) -> tuple[str, str, int]:
    m = h.segment.meta
    return (m.namespace, m.topic, m.segment_id)


def _successors(body: dict[str, Any]) -> list[wire.Successor]:
    """The ``successors`` of a terminate or announce request, checked."""
    return [wire.Successor.from_json(s) for s in body.get("successors", [])]


def _successors_to_open(body: dict[str, Any], successors: list[wire.Successor]) -> list[int]:
    """The ``open`` field of a terminate request: successors hosted here that the controller
    lets this broker activate once the seal is durable (a split's children placed with their
    parent, whose only parent is this segment). Each must be one of ``successors``."""
    raw = body.get("open", [])
    if not isinstance(raw, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in raw
    ):
        raise ValueError("open must be a list of segment ids")
    named = {s.segment_id for s in successors}
    unknown = sorted(set(raw) - named)
    if unknown:
        raise ValueError(f"open names segments that are not successors: {unknown}")
    return sorted(set(raw))


def _int(body: dict[str, Any], name: str, default: int | None = None) -> int:
    value = body.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer")
    return value


def _check_subscription_name(name: str) -> None:
    from .storage.segment import SUBSCRIPTION_NAME

    if not SUBSCRIPTION_NAME.match(name):
        raise ValueError(f"invalid subscription name {name!r}")

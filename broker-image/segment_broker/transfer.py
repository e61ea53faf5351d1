"""Ownership transfer on the broker (DESIGN §9, seed 004; docs/protocol.md, "Ownership
transfer"). The leader drives it (``core.transfer``); these admin routes are its steps:

source                                   destination
``POST …/transfer/snapshot``  ─────────► ``PUT …/transfer/incoming`` (a fenced copy)
``POST …/transfer/read?from=N`` ───────► ``POST …/transfer/append``  (same positions)
``POST …/transfer/fence``                ``PUT …/transfer/state``    (cursors, seal: merged)
``POST …/transfer/release`` (after own)  ``POST …/transfer/own``
``POST …/transfer/unfence`` (roll back)

The leader relays the bytes: brokers never call each other, so the only credential involved
is the operator's, checked like every ``/admin`` route. Read routes are ``POST`` so that the
"consumers may ``GET`` one segment" rule of the access check never opens a log to a client.

Producers' last sequence ids travel with the entries (the destination records them as it
appends, exactly as a producer's own appends would) plus, for producers whose entries the
source's retention already deleted, the source's dedup snapshot below its first position.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from scalable_topics.core import wire
from scalable_topics.core.subscriptions import BrokerSubscriptionType
from scalable_topics.core.transfer import CLOSE_SEGMENT_MOVED, ERR_SEGMENT_MOVED, moved_fields

from .routes import hosted_segment, read_body, run_admin, segment_key
from .storage.cursor import Cursor
from .storage.fsutil import atomic_write_json, fsync_dir, read_json
from .storage.segment import Retention, SealInfo, Segment, SegmentMeta
from .store import ConflictError, HostedSegment, NotFoundError, SegmentStore, validate_name

INCOMING = "incoming"
RELEASING = "releasing"
log = logging.getLogger(__name__)
RECORD = struct.Struct("<qI")
"""A copied entry on the wire: ``i64 position, u32 length``, then the entry."""
DEFAULT_READ_BYTES = 4 * 1024 * 1024
MAX_READ_BYTES = 64 * 1024 * 1024
MAX_APPEND_BYTES = MAX_READ_BYTES + 2 * wire.MAX_ENTRY_SIZE


def digest(segment: Segment) -> str:
    """What two equal copies agree on: the last acknowledged position and the seal."""
    seal = segment.seal
    body = {
        "lastPosition": segment.visible_position,
        "seal": None if seal is None else [seal.last_position, seal.successors],
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def snapshot(hosted: HostedSegment) -> dict[str, Any]:
    seg = hosted.segment
    dedup = seg.directory / f"dedup-{seg.log.first_position:020d}.json"
    return {
        "meta": seg.meta.to_json(),
        "firstPosition": seg.log.first_position,
        "lastPosition": seg.visible_position,
        "writable": seg.writable,
        "fenceReason": seg.fence_reason,
        "cursors": {name: cur.to_json() for name, cur in sorted(seg.cursors.items())},
        "seal": None if seg.seal is None else seg.seal.to_json(),
        "producers": {name: st.last_seq for name, st in sorted(seg.producers.items())},
        "dedupBelowFirst": read_json(dedup) if dedup.exists() else None,
        "ignoredEntries": seg.ignored_while_releasing,
        "digest": digest(seg),
    }


def encode_records(items: list[tuple[int, Any]]) -> bytes:
    out = bytearray()
    for position, entry in items:
        out += RECORD.pack(position, len(entry))
        out += entry
    return bytes(out)


def decode_records(data: bytes) -> list[tuple[int, memoryview]]:
    view = memoryview(data)
    items: list[tuple[int, memoryview]] = []
    off = 0
    while off < len(view):
        if off + RECORD.size > len(view):
            raise ValueError("truncated record header in the copied entries")
        position, length = RECORD.unpack_from(view, off)
        off += RECORD.size
        if off + length > len(view):
            raise ValueError(f"entry at position {position} is cut short")
        items.append((position, view[off : off + length]))
        off += length
    return items


def merge_cursor(into: Cursor, source: Cursor) -> bool:
    """Acknowledge in ``into`` everything ``source`` acknowledged, batch indexes of entries
    included (a union: acknowledgements only grow, so merging again, in any order, is safe).
    True when something changed."""
    changed = False
    if source.ack_floor > into.ack_floor:
        changed = into.ack_cumulative(source.ack_floor - 1) or changed
    for start, end in zip(source.starts, source.ends, strict=True):
        for position in range(max(start, into.ack_floor), end):
            changed = into.ack(position) or changed
    for position, indexes in source.partial.items():
        changed = into.ack_partial(position, indexes) or changed
    return changed


async def hold_incoming(hosted: HostedSegment, wait_s: float) -> bool:
    """A client that reaches a transfer's destination before it owns the segment waits (at
    most ``wait_s``) instead of being refused; False when ownership did not come in time."""
    seg = hosted.segment
    if seg.fence_reason != INCOMING:
        return True
    try:
        async with asyncio.timeout(wait_s):
            await seg.writable_event.wait()
    except TimeoutError:
        return False
    return True


async def hand_off(store: SegmentStore, wait_s: float) -> int:
    """Graceful shutdown: keep serving, for at most ``wait_s``, while the leader moves the
    segments of this (terminating, so draining) broker to the others; returns how many were
    still here. Their clients follow each move through the close frame, so a rolling restart
    costs writers no outage."""
    if wait_s <= 0 or not store.segments:
        return len(store.segments)
    log.info("handing %d segment(s) off before stopping (up to %g s)", len(store.segments), wait_s)
    deadline = time.monotonic() + wait_s
    while store.segments and time.monotonic() < deadline:  # noqa: ASYNC110 - polled with a
        await asyncio.sleep(0.05)  # deadline: segments leave through the admin API
    left = len(store.segments)
    if left:
        log.warning("stopping with %d segment(s) not handed off after %g s", left, wait_s)
    else:
        log.info("every segment handed off")
    return left


class TransferRoutes:
    def __init__(self, store: SegmentStore) -> None:
        self.store = store

    def register(self, app: web.Application, segment_path: str) -> None:
        r = app.router
        base = segment_path + "/transfer"
        r.add_post(base + "/snapshot", self._route(self.snapshot))
        r.add_post(base + "/read", self._route(self.read))
        r.add_put(base + "/incoming", self._route(self.incoming))
        r.add_post(base + "/append", self._route(self.append))
        r.add_put(base + "/state", self._route(self.state))
        r.add_post(base + "/fence", self._route(self.fence))
        r.add_post(base + "/unfence", self._route(self.unfence))
        r.add_post(base + "/own", self._route(self.own))
        r.add_post(base + "/release", self._route(self.release))

    def _route(
        self, handler: Callable[[web.Request], Awaitable[web.Response]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def route(request: web.Request) -> web.Response:
            return await run_admin(request, functools.partial(handler, request))

        return route

    def _hosted(self, request: web.Request) -> HostedSegment:
        return hosted_segment(self.store, request)

    # -- source ---------------------------------------------------------------------------------

    async def snapshot(self, request: web.Request) -> web.Response:
        return web.json_response(snapshot(self._hosted(request)))

    async def read(self, request: web.Request) -> web.Response:
        hosted = self._hosted(request)
        seg = hosted.segment
        position = _query_int(request, "from", None)
        budget = min(_query_int(request, "maxBytes", DEFAULT_READ_BYTES), MAX_READ_BYTES)
        if position < seg.log.first_position:
            raise ConflictError(
                f"position {position} is below the segment's first position "
                f"{seg.log.first_position}"
            )
        items: list[tuple[int, Any]] = []
        used = 0
        while used < budget:
            got = seg.read(position, 4096, budget - used)
            if not got:
                break
            items.extend(got)
            used += sum(len(e) for _, e in got)
            position = got[-1][0] + 1
        return web.Response(
            body=encode_records(items),
            content_type="application/octet-stream",
            headers={"X-Last-Position": str(seg.visible_position)},
        )

    async def fence(self, request: web.Request) -> web.Response:
        hosted = self._hosted(request)
        seg = hosted.segment
        if seg.fence_reason == RELEASING:
            return web.json_response(snapshot(hosted))
        if not seg.writable:
            raise ConflictError(f"segment {seg.name} is fenced ({seg.fence_reason or 'child'})")
        await seg.fence(RELEASING)
        return web.json_response(snapshot(hosted))

    async def unfence(self, request: web.Request) -> web.Response:
        """Roll back: producers whose publishes were ignored reconnect (here) and re-send them
        before this source takes any later entry of theirs."""
        hosted = self._hosted(request)
        seg = hosted.segment
        if seg.fence_reason != RELEASING:
            return web.json_response(snapshot(hosted))
        for conn in list(hosted.producers.values()):
            conn.close_soon("GoingAway", "transfer rolled back; reconnect", wire.CLOSE_GOING_AWAY)
        await seg.activate()
        return web.json_response(snapshot(hosted))

    async def release(self, request: web.Request) -> web.Response:
        """After the destination owns the segment: close every client with its URL, then
        delete this copy. The cursors as they were once the consumers left are returned for the
        leader to merge into the destination."""
        body = await read_body(request)
        url = body.get("brokerUrl")
        if not isinstance(url, str) or not url:
            raise ValueError("brokerUrl (the new owner's URL) is required")
        redirect = body.get("redirect", True)
        if not isinstance(redirect, bool):
            raise ValueError("redirect must be a boolean")
        key = segment_key(request)
        hosted = self.store.get(*key)
        seg = hosted.segment
        if seg.fence_reason != RELEASING:
            raise ConflictError(f"segment {seg.name} is not released by a transfer")
        message = f"segment moved to {url}"
        for conn in list(hosted.connections):
            if redirect:
                conn.close_soon(ERR_SEGMENT_MOVED, message, CLOSE_SEGMENT_MOVED, moved_fields(url))
            else:  # a plain close: the client finds the owner again through its DAG session
                conn.close_soon("GoingAway", message, wire.CLOSE_GOING_AWAY)
        waits = [conn.done.wait() for conn in list(hosted.connections)]
        if waits:
            # Bounded like a shutdown: a peer that never answers the close is cut off.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await asyncio.gather(*waits)
        cursors = {name: cur.to_json() for name, cur in sorted(seg.cursors.items())}
        await self.store.delete(*key)
        return web.json_response({"released": True, "cursors": cursors})

    # -- destination ----------------------------------------------------------------------------

    async def incoming(self, request: web.Request) -> web.Response:
        """Create the destination's fenced copy from the source's snapshot (idempotent)."""
        namespace, topic, sid = segment_key(request)
        body = await read_body(request)
        meta = SegmentMeta.from_json(body["meta"])
        if (meta.namespace, meta.topic, meta.segment_id) != (namespace, topic, sid):
            raise ValueError("the snapshot names another segment than the path")
        validate_name("namespace", namespace)
        validate_name("topic", topic)
        meta = SegmentMeta(
            namespace=namespace,
            topic=topic,
            segment_id=sid,
            range_start=meta.range_start,
            range_end=meta.range_end,
            buckets=meta.buckets,
            created_at=meta.created_at,
            retention=Retention.from_json(body["meta"].get("retention")),
        )
        first = body.get("firstPosition", 0)
        if not isinstance(first, int) or first < 0:
            raise ValueError("firstPosition must be a non-negative integer")
        subs = {
            name: BrokerSubscriptionType(str(cur["type"])).value
            for name, cur in dict(body.get("cursors", {})).items()
        }
        dedup = body.get("dedupBelowFirst")
        key = (namespace, topic, sid)
        async with self.store._lock(key):
            hosted = self.store.segments.get(key)
            if hosted is not None:
                existing = hosted.segment.meta
                if (existing.range_start, existing.range_end, existing.buckets) != (
                    meta.range_start,
                    meta.range_end,
                    meta.buckets,
                ):
                    raise ConflictError(f"segment {existing.descriptor} exists with other settings")
                return web.json_response(snapshot(hosted), status=200)
            directory = self.store._segment_dir(meta)

            def create() -> None:
                directory.mkdir(parents=True, exist_ok=True)
                if first:
                    # The copy's log starts where the source's does (retention deleted below).
                    (directory / f"log-{first:020d}.log").touch()
                    if isinstance(dedup, dict):
                        atomic_write_json(directory / f"dedup-{first:020d}.json", dedup)
                    fsync_dir(directory)
                Segment.create_blocking(
                    directory, meta, subs, writable=False, fence_reason=INCOMING
                )

            await asyncio.get_running_loop().run_in_executor(self.store.executor, create)
            hosted = await self.store._host(directory, meta)
        return web.json_response(snapshot(hosted), status=201)

    async def append(self, request: web.Request) -> web.Response:
        hosted = self._hosted(request)
        seg = hosted.segment
        if seg.fence_reason != INCOMING:
            raise ConflictError(f"segment {seg.name} is not a transfer's incoming copy")
        for position, entry in decode_records(await _body_bytes(request)):
            if position < seg.log.next_position:
                continue  # copied before (a repeated step)
            if position != seg.log.next_position:
                raise ConflictError(
                    f"copy of {seg.name} expects position {seg.log.next_position}, got {position}"
                )
            header = wire.decode_entry_header(entry)
            _, duplicate = seg.append(bytes(entry), header, copying=True)
            if duplicate:
                raise ConflictError(
                    f"copy of {seg.name} diverged: producer {header.producer_name!r} sequence "
                    f"{header.sequence_id} at position {position} is already stored"
                )
        await seg.wait_flushed()
        return web.json_response(snapshot(hosted))

    async def state(self, request: web.Request) -> web.Response:
        """Merge the source's cursors (acknowledgements only grow) and copy its seal."""
        hosted = self._hosted(request)
        seg = hosted.segment
        body = await read_body(request)
        for name, data in dict(body.get("cursors", {})).items():
            source = Cursor.from_json(data)
            if name not in seg.cursors:
                await self.store.create_subscription(hosted, name, source.type, at_end=False)
            merge_cursor(seg.cursors[name], source)
        await seg.persist_cursors()
        seal = body.get("seal")
        if seal is not None and seg.seal is None:
            if seg.fence_reason != INCOMING:
                raise ConflictError(f"segment {seg.name} is not a transfer's incoming copy")
            info = SealInfo.from_json(seal)
            if info.last_position != seg.visible_position:
                raise ConflictError(
                    f"seal at {info.last_position} but the copy ends at {seg.visible_position}"
                )
            await seg.adopt_seal(info)
        for disp in hosted.dispatchers.values():
            disp.schedule()
        return web.json_response(snapshot(hosted))

    async def own(self, request: web.Request) -> web.Response:
        """The destination acknowledges ownership: held clients are admitted."""
        hosted = self._hosted(request)
        seg = hosted.segment
        if seg.fence_reason == INCOMING:
            await seg.activate()
        elif not seg.writable:
            raise ConflictError(f"segment {seg.name} is fenced ({seg.fence_reason or 'child'})")
        return web.json_response(snapshot(hosted))


async def _body_bytes(request: web.Request) -> bytes:
    """The copied entries: read past the app's 1 MiB body limit (a chunk of the source's log,
    or one entry of up to 16 MiB), up to :data:`MAX_APPEND_BYTES`."""
    data = bytearray()
    while chunk := await request.content.read(1 << 20):
        data += chunk
        if len(data) > MAX_APPEND_BYTES:
            raise ValueError(f"copied entries larger than {MAX_APPEND_BYTES} bytes in one request")
    return bytes(data)


def _query_int(request: web.Request, name: str, default: int | None) -> int:
    text = request.query.get(name)
    if text is None:
        if default is None:
            raise ValueError(f"query parameter {name!r} is required")
        return default
    try:
        return wire.parse_id(text)
    except wire.WireError:
        raise ValueError(f"query parameter {name!r} must be a non-negative integer") from None


__all__ = [
    "INCOMING",
    "RELEASING",
    "NotFoundError",
    "TransferRoutes",
    "decode_records",
    "encode_records",
    "hold_incoming",
    "merge_cursor",
    "snapshot",
]

"""The broker's aiohttp application: admin HTTP, WebSocket produce and consume, metrics.

Wire protocol: docs/protocol.md. Every WebSocket connection serves one segment (produce) or one
subscription of one segment (consume); a malformed frame closes only that connection (close code
4000, counted in ``segment_broker_protocol_errors_total{kind}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from scalable_topics.core import wire
from scalable_topics.core.wire import WireError

from .config import BrokerConfig
from .corruption import CorruptionReporter
from .dispatch import Consumer, Dispatcher, DispatchError
from .load import LoadTracker
from .metrics import BrokerMetrics
from .storage.cursor import SubscriptionType
from .storage.log import Corruption
from .storage.segment import (
    Retention,
    SegmentCorruptedError,
    SegmentGoneError,
    SegmentNotWritableError,
    SegmentReleasingError,
    SegmentSealedError,
    StorageSettings,
)
from .store import ConflictError, HostedSegment, NotFoundError, SegmentStore
from .transfer import TransferRoutes, hold_incoming

log = logging.getLogger(__name__)

HELLO_TIMEOUT = 10.0
CLOSE_TIMEOUT = 2.0
"""How long a close waits for the peer's close frame (a gone peer must not stall shutdown)."""
MAX_DELIVER_ITEMS = 1024
_ERROR_STATUS = {
    "BadRequest": 400,
    "Unauthorized": 401,
    "NotFound": 404,
    "SegmentNotFound": 404,
    "SubscriptionNotFound": 404,
    "Conflict": 409,
    "SegmentCorrupted": 409,
    "StorageError": 500,
    "NotReady": 503,
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_error(code: str, message: str, status: int | None = None) -> web.Response:
    return web.json_response(
        {"error": {"code": code, "message": message}}, status=status or _ERROR_STATUS.get(code, 400)
    )


class _Closing(Exception):
    """Internal: stop serving a connection with a close code and an error frame."""

    def __init__(
        self,
        kind: str,
        code: str,
        message: str,
        close_code: int,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.code = code
        self.close_code = close_code
        self.extra = extra or {}


def _close_reason(message: str) -> bytes:
    """A WebSocket close reason holds at most 123 bytes: cut on a UTF-8 character boundary
    (the ERROR frame before the close carries the whole message)."""
    return message.encode()[:120].decode(errors="ignore").encode()


def _protocol(kind: str, message: str) -> _Closing:
    return _Closing(kind, wire.ERR_PROTOCOL, message, wire.CLOSE_PROTOCOL_ERROR)


def _corrupted(corruption: Corruption) -> _Closing:
    """``ERROR SegmentCorrupted {position}``, close 4010: the segment is quarantined."""
    return _Closing(
        "corrupted",
        wire.ERR_SEGMENT_CORRUPTED,
        f"segment corrupted at position {corruption.position} ({corruption.reason}); it is "
        "quarantined until an operator truncates it",
        wire.CLOSE_SEGMENT_CORRUPTED,
        {"position": corruption.position},
    )


def _not_writable() -> _Closing:
    return _Closing(
        "not_writable",
        wire.ERR_SEGMENT_NOT_WRITABLE,
        "segment not writable yet (its parents are being sealed); retry",
        wire.CLOSE_SEGMENT_NOT_WRITABLE,
    )


class TokenAuth:
    """Bearer-token check for admin routes; the token file (a mounted Secret) is re-read when
    its modification time changes, so a rotated secret takes effect without a restart."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mtime = -1.0
        self._token = b""

    def _current(self) -> bytes:
        try:
            mtime = self.path.stat().st_mtime
        except OSError:
            return b""
        if mtime != self._mtime:
            self._token = self.path.read_bytes().strip()
            self._mtime = mtime
        return self._token

    def check(self, header: str | None) -> bool:
        token = self._current()
        if not token or not header or not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[7:].strip().encode(), token)


class Broker:
    def __init__(
        self,
        config: BrokerConfig,
        *,
        metrics: BrokerMetrics | None = None,
        tracker: LoadTracker | None = None,
        corruption_reporter: CorruptionReporter | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or BrokerMetrics()
        self.tracker = tracker
        self.store = SegmentStore(
            Path(config.data_dir),
            StorageSettings(
                fsync=config.fsync,
                fsync_interval_ms=config.fsync_interval_ms,
                roll_bytes=config.roll_bytes,
                cache_bytes=config.cache_bytes,
                cursor_flush_ms=config.cursor_flush_ms,
            ),
            self.metrics,
            tracker,
            corruption_reporter,
        )
        self.metrics.watch_segments(lambda: self.store)
        self.auth = TokenAuth(Path(config.admin_token_file)) if config.admin_token_file else None
        self.ready = False
        self.stopping = False
        self._connections: set[_Connection] = set()

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        await self.store.open()
        self.ready = True

    async def stop(self) -> None:
        self.ready = False
        self.stopping = True
        for conn in list(self._connections):
            conn.close_soon("GoingAway", "broker shutting down", wire.CLOSE_GOING_AWAY)
        waits = [conn.done.wait() for conn in list(self._connections)]
        if waits:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await asyncio.gather(*waits)
        await self.store.close()

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth_middleware], client_max_size=1 << 20)
        r = app.router
        r.add_get("/healthz", self.healthz)
        r.add_get("/readyz", self.readyz)
        r.add_get("/metrics", self.metrics_handler)
        base = "/admin/v1/segments"
        seg = base + "/{namespace}/{topic}/{segment_id}"
        r.add_get(base, self.list_segments)
        r.add_put(seg, self.create_segment)
        r.add_get(seg, self.segment_stats)
        r.add_delete(seg, self.delete_segment)
        r.add_post(seg + "/terminate", self.terminate_segment)
        r.add_post(seg + "/activate", self.activate_segment)
        r.add_post(seg + "/truncate", self.truncate_segment)
        r.add_put(seg + "/subscriptions/{subscription}", self.create_subscription)
        r.add_delete(seg + "/subscriptions/{subscription}", self.delete_subscription)
        r.add_get("/ws/v1/produce/{namespace}/{topic}/{segment_id}", self.produce)
        r.add_get("/ws/v1/consume/{namespace}/{topic}/{segment_id}/{subscription}", self.consume)
        TransferRoutes(self).register(app, seg)
        return app

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/admin/"):
            if self.auth is not None and not self.auth.check(request.headers.get("Authorization")):
                return json_error("Unauthorized", "missing or wrong bearer token")
            if not self.ready:
                return json_error("NotReady", "broker is recovering or stopping")
        return await handler(request)

    # --- health / metrics ----------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        if self.ready:
            return web.json_response(
                {
                    "status": "ready",
                    "segments": len(self.store.segments),
                    "unrecoverable": self.store.unrecoverable,
                    "corrupted": {
                        h.segment.name: h.segment.corruption.to_json()
                        for h in self.store
                        if h.segment.corruption is not None
                    },
                }
            )
        return web.json_response({"status": "not ready"}, status=503)

    async def metrics_handler(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    # --- admin ---------------------------------------------------------------------------------

    @staticmethod
    def _segment_key(request: web.Request) -> tuple[str, str, int]:
        """``(namespace, topic, segment id)`` of a path; a malformed id is a ``WireError``
        (400 on admin routes, close 4000 on WebSockets)."""
        info = request.match_info
        return info["namespace"], info["topic"], wire.parse_id(info["segment_id"])

    def _hosted(self, request: web.Request) -> HostedSegment:
        return self.store.get(*self._segment_key(request))

    @staticmethod
    async def _body(request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        return wire.parse_json_object(await request.read(), "request body")

    async def _admin(
        self, request: web.Request, action: Callable[[], Awaitable[web.Response]]
    ) -> web.Response:
        try:
            return await action()
        except NotFoundError as exc:
            return json_error("SegmentNotFound", str(exc))
        except ConflictError as exc:
            return json_error("Conflict", str(exc))
        except SegmentCorruptedError as exc:
            return json_error("SegmentCorrupted", str(exc))
        except (ValueError, KeyError, TypeError) as exc:
            return json_error(
                "BadRequest", str(exc) if not isinstance(exc, KeyError) else f"missing field {exc}"
            )
        except OSError as exc:
            # A full disk (507), a read-only or broken volume: said to the caller and logged,
            # the broker keeps serving every other segment.
            log.error("%s %s failed on storage: %s", request.method, request.path, exc)
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            return json_error("StorageError", f"{exc}", 507 if full else 500)

    async def list_segments(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"segments": [self._summary(h) for h in sorted(self.store, key=_sort_key)]}
        )

    async def create_segment(self, request: web.Request) -> web.Response:
        async def action() -> web.Response:
            namespace, topic, sid = self._segment_key(request)
            body = await self._body(request)
            rng = body["range"]
            if not isinstance(rng, dict):
                raise ValueError("range must be an object {start, end}")
            start, end = _int(rng, "start"), _int(rng, "end")
            buckets = _int(body, "buckets", 1)
            writable = body.get("writable", True)
            if not isinstance(writable, bool):
                raise ValueError("writable must be a boolean")
            subs: dict[str, SubscriptionType] = {}
            for item in body.get("subscriptions", []):
                if not isinstance(item, dict):
                    raise ValueError("subscriptions must be objects {name, type}")
                name = str(item["name"])
                _check_subscription_name(name)
                subs[name] = SubscriptionType.parse(str(item.get("type", "Exclusive")))
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
            )
            return web.json_response(self._stats(hosted), status=201 if created else 200)

        return await self._admin(request, action)

    async def segment_stats(self, request: web.Request) -> web.Response:
        async def action() -> web.Response:
            return web.json_response(self._stats(self._hosted(request)))

        return await self._admin(request, action)

    async def delete_segment(self, request: web.Request) -> web.Response:
        async def action() -> web.Response:
            namespace, topic, sid = self._segment_key(request)
            if not await self.store.delete(namespace, topic, sid):
                raise NotFoundError(f"segment {namespace}/{topic}/{sid} not found")
            return web.json_response({"deleted": True})

        return await self._admin(request, action)

    async def terminate_segment(self, request: web.Request) -> web.Response:
        async def action() -> web.Response:
            hosted = self._hosted(request)
            body = await self._body(request)
            successors = [_successor(s) for s in body.get("successors", [])]
            seal = await hosted.segment.terminate(successors)
            return web.json_response({"sealed": True, **seal.to_json()})

        return await self._admin(request, action)

    async def activate_segment(self, request: web.Request) -> web.Response:
        async def action() -> web.Response:
            hosted = await self.store.activate(*self._segment_key(request))
            return web.json_response(self._summary(hosted))

        return await self._admin(request, action)

    async def truncate_segment(self, request: web.Request) -> web.Response:
        async def action() -> web.Response:
            body = await self._body(request)
            position = _int(body, "position")
            acknowledge = body.get("acknowledgeLoss")
            if not isinstance(acknowledge, str):
                raise ValueError("acknowledgeLoss must be the segment's <namespace>/<topic>/<id>")
            hosted, report = await self.store.truncate(
                *self._segment_key(request), position, acknowledge
            )
            return web.json_response(
                {
                    **self._summary(hosted),
                    "truncated": {
                        "position": report.position,
                        "droppedBytes": report.dropped_bytes,
                        "droppedFiles": report.dropped_files,
                    },
                }
            )

        return await self._admin(request, action)

    async def create_subscription(self, request: web.Request) -> web.Response:
        async def action() -> web.Response:
            hosted = self._hosted(request)
            body = await self._body(request)
            name = request.match_info["subscription"]
            _check_subscription_name(name)
            sub_type = SubscriptionType.parse(str(body.get("type", "Exclusive")))
            initial = str(body.get("initialPosition", "earliest")).lower()
            if initial not in ("earliest", "latest"):
                raise ValueError("initialPosition must be 'earliest' or 'latest'")
            created = await self.store.create_subscription(
                hosted, name, sub_type, at_end=initial == "latest"
            )
            disp = hosted.dispatchers[name]
            return web.json_response({"name": name, **disp.stats()}, status=201 if created else 200)

        return await self._admin(request, action)

    async def delete_subscription(self, request: web.Request) -> web.Response:
        async def action() -> web.Response:
            hosted = self._hosted(request)
            name = request.match_info["subscription"]
            if not await self.store.delete_subscription(hosted, name):
                return json_error("SubscriptionNotFound", f"no subscription {name!r}")
            return web.json_response({"deleted": True})

        return await self._admin(request, action)

    def _summary(self, hosted: HostedSegment) -> dict[str, Any]:
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

    def _stats(self, hosted: HostedSegment) -> dict[str, Any]:
        seg = hosted.segment
        return {
            **self._summary(hosted),
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

    # --- WebSocket -----------------------------------------------------------------------------

    async def _open_ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(
            max_msg_size=self.config.max_frame_bytes,
            compress=False,
            heartbeat=30.0,
            timeout=CLOSE_TIMEOUT,
            writer_limit=1 << 20,
        )
        await ws.prepare(request)
        return ws

    async def produce(self, request: web.Request) -> web.StreamResponse:
        if not self.ready:
            return json_error("NotReady", "broker is recovering or stopping")
        ws = await self._open_ws(request)
        conn = ProducerConnection(self, ws, request)
        await conn.serve()
        return ws

    async def consume(self, request: web.Request) -> web.StreamResponse:
        if not self.ready:
            return json_error("NotReady", "broker is recovering or stopping")
        ws = await self._open_ws(request)
        conn = ConsumerConnection(self, ws, request)
        await conn.serve()
        return ws


def _sort_key(h: HostedSegment) -> tuple[str, str, int]:
    m = h.segment.meta
    return (m.namespace, m.topic, m.segment_id)


def _int(body: dict[str, Any], name: str, default: int | None = None) -> int:
    value = body.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer")
    return value


def _check_subscription_name(name: str) -> None:
    from .storage.segment import SUBSCRIPTION_NAME

    if not SUBSCRIPTION_NAME.match(name):
        raise ValueError(f"invalid subscription name {name!r}")


def _successor(item: Any) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise ValueError("successors must be objects {segmentId, range, brokerUrl}")
    rng = item.get("range")
    if not isinstance(rng, dict):
        raise ValueError("successor range must be an object {start, end}")
    start, end = _int(rng, "start"), _int(rng, "end")
    if not 0 <= start <= end <= 0xFFFF:
        raise ValueError(f"invalid successor range [{start}, {end}]")
    url = item.get("brokerUrl")
    if url is not None and not isinstance(url, str):
        raise ValueError("brokerUrl must be a string")
    return {
        "segmentId": wire.check_id(item.get("segmentId")),
        "range": {"start": start, "end": end},
        "brokerUrl": url,
    }


class _Connection:
    """Common WebSocket plumbing: HELLO, ordered outgoing frames, protocol-error closes."""

    role = "?"

    def __init__(self, broker: Broker, ws: web.WebSocketResponse, request: web.Request) -> None:
        self.broker = broker
        self.ws = ws
        self.request = request
        self.metrics = broker.metrics
        self.out: deque[bytes] = deque()
        self.out_event = asyncio.Event()
        self.done = asyncio.Event()
        self.version = wire.PROTOCOL_VERSION
        self.hosted: HostedSegment | None = None
        self._close: tuple[str, str, int] | None = None
        self._close_extra: dict[str, Any] = {}
        """More fields of the closing ERROR frame (e.g. ``position`` of SegmentCorrupted)."""
        self._reader: asyncio.Task[Any] | None = None

    def send(self, frame: bytes) -> None:
        self.out.append(frame)
        self.out_event.set()

    def close_soon(
        self,
        code: str,
        message: str,
        close_code: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Ask the connection to send an ERROR frame (with ``extra`` fields) and close (used by
        admin deletes); a close already asked for wins."""
        if self._close is None:
            codes = {
                "SegmentDeleted": wire.CLOSE_SEGMENT_DELETED,
                "SubscriptionNotFound": wire.CLOSE_SUBSCRIPTION_NOT_FOUND,
                "ProducerFenced": wire.CLOSE_PRODUCER_FENCED,
            }
            self._close = (code, message, close_code or codes.get(code, wire.CLOSE_GOING_AWAY))
            self._close_extra = extra or {}
            self.out_event.set()
            if self._reader is not None:
                self._reader.cancel()

    async def _hello(self) -> dict[str, Any]:
        try:
            msg = await asyncio.wait_for(self.ws.receive(), HELLO_TIMEOUT)
        except TimeoutError:
            raise _protocol("hello_timeout", "no HELLO within 10 s") from None
        if msg.type != WSMsgType.BINARY:
            if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                raise _Closing("peer_closed", "Closed", "closed before HELLO", 1000)
            raise _protocol("text_frame", "expected a binary HELLO frame")
        version, body = wire.decode_hello(msg.data)
        if version < wire.MIN_PROTOCOL_VERSION:
            raise _Closing(
                "version",
                wire.ERR_UNSUPPORTED_VERSION,
                f"protocol version {version} unsupported (server speaks "
                f"{wire.MIN_PROTOCOL_VERSION}..{wire.PROTOCOL_VERSION})",
                wire.CLOSE_UNSUPPORTED_VERSION,
            )
        self.version = min(version, wire.PROTOCOL_VERSION)
        key = Broker._segment_key(self.request)
        try:
            self.hosted = self.broker.store.get(*key)
        except NotFoundError as exc:
            raise _Closing(
                "segment_not_found",
                wire.ERR_SEGMENT_NOT_FOUND,
                str(exc),
                wire.CLOSE_SEGMENT_NOT_FOUND,
            ) from None
        return body

    async def serve(self) -> None:
        self.broker._connections.add(self)
        self.metrics.connections.labels(self.role).inc()
        writer: asyncio.Task[None] | None = None
        try:
            body = await self._hello()
            await self._admit()
            self._start(body)
            assert self.hosted is not None
            self.hosted.connections.add(self)
            writer = asyncio.get_running_loop().create_task(self._writer())
            self._reader = asyncio.get_running_loop().create_task(self._read_loop())
            try:
                await self._reader
            except asyncio.CancelledError:
                if self._close is None:
                    raise
        except _Closing as exc:
            await self._fail(exc)
        except WireError as exc:
            await self._fail(_protocol(exc.kind, str(exc)))
        except asyncio.CancelledError:
            if self._close is None:
                raise
        except Exception:
            log.exception("%s connection failed", self.role)
            await self._fail(_Closing("internal", "InternalError", "internal error", 1011))
        finally:
            self._stop()
            if self._close is not None and not self.ws.closed:
                code, message, close_code = self._close
                await self._flush_out()
                with contextlib.suppress(Exception):
                    await self.ws.send_bytes(wire.encode_error(code, message, **self._close_extra))
                    await self.ws.close(code=close_code, message=_close_reason(message))
            if writer is not None:
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await writer
            if self.hosted is not None:
                self.hosted.connections.discard(self)
            self.broker._connections.discard(self)
            if not self.ws.closed:
                with contextlib.suppress(Exception):
                    await self.ws.close()
            self.done.set()

    async def _flush_out(self) -> None:
        while self.out and not self.ws.closed:
            with contextlib.suppress(Exception):
                await self.ws.send_bytes(self.out.popleft())

    async def _fail(self, exc: _Closing) -> None:
        if exc.close_code == wire.CLOSE_PROTOCOL_ERROR:
            self.metrics.protocol_errors.labels(exc.kind).inc()
            log.info("%s protocol error (%s): %s", self.role, exc.kind, exc)
        if self.ws.closed:
            return
        with contextlib.suppress(Exception):
            await self.ws.send_bytes(wire.encode_error(exc.code, str(exc), **exc.extra))
            await self.ws.close(code=exc.close_code, message=_close_reason(str(exc)))

    async def _writer(self) -> None:
        ws = self.ws
        while True:
            await self.out_event.wait()
            self.out_event.clear()
            self._before_write()
            while self.out:
                await ws.send_bytes(self.out.popleft())
            if self._close is not None and self._reader is not None:
                self._reader.cancel()
                return

    async def _read_loop(self) -> None:
        ws = self.ws
        while True:
            msg = await ws.receive()
            if msg.type == WSMsgType.BINARY:
                self._on_frame(msg.data)
                await self._after_frame()
            elif msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                return
            elif msg.type == WSMsgType.ERROR:
                raise _protocol("bad_websocket", f"WebSocket error: {ws.exception()}")
            else:
                raise _protocol("text_frame", "only binary frames are allowed")

    async def _admit(self) -> None:
        """Wait, if need be, until the segment may serve this connection."""

    def _start(self, hello: dict[str, Any]) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        pass

    def _on_frame(self, data: bytes) -> None:
        raise NotImplementedError

    async def _after_frame(self) -> None:
        pass

    def _before_write(self) -> None:
        pass


class ProducerConnection(_Connection):
    """Pipelined produce: entries are staged as they arrive; acks go out in send order once
    the group commit covering them completes."""

    role = "producer"

    def __init__(self, broker: Broker, ws: web.WebSocketResponse, request: web.Request) -> None:
        super().__init__(broker, ws, request)
        self.unacked: deque[tuple[int, int, int, int]] = deque()
        """(sequence id, position, status, bytes); status -1 marks an entry error."""
        self.errors: dict[int, tuple[str, str]] = {}
        self.inflight_bytes = 0
        self.window = broker.config.max_inflight_bytes
        self.window_open = asyncio.Event()
        self.window_open.set()
        self.refused = False
        self._waiting_for_seal = False
        self.producer_name = ""

    async def _admit(self) -> None:
        """A fenced segment (a child whose parents are being sealed) holds the handshake until
        it is activated: producers redirected by the parents' seal arrive moments before the
        controller opens the children, and waiting here saves them a reconnect."""
        assert self.hosted is not None
        seg = self.hosted.segment
        if seg.corruption is not None and not seg.sealed:
            raise _corrupted(seg.corruption)
        if seg.writable or seg.sealed:
            return
        try:
            async with asyncio.timeout(self.broker.config.fence_wait_s):
                await seg.writable_event.wait()
        except TimeoutError:
            self.metrics.fenced_handshakes.labels("refused").inc()
            raise _not_writable() from None
        self.metrics.fenced_handshakes.labels("opened").inc()

    def _start(self, hello: dict[str, Any]) -> None:
        assert self.hosted is not None
        name = hello.get("producerName")
        if not isinstance(name, str) or not 0 < len(name.encode()) <= wire.MAX_PRODUCER_NAME:
            raise _protocol("bad_hello", "HELLO needs a producerName of 1..255 bytes")
        self.producer_name = name
        previous = self.hosted.producers.get(name)
        if previous is not None and previous is not self:
            # One connection per producer name: interleaving two writers' sequence ids would
            # make the dedup table drop one of them. The newest connection wins (a restarted
            # producer must not wait for its stale connection to time out).
            previous.close_soon("ProducerFenced", "a newer connection took over this producer")
        self.hosted.producers[name] = self
        seg = self.hosted.segment
        seg.listeners.add(self._on_durable)
        seg.seal_listeners.add(self._on_seal)
        meta = seg.meta
        self.send(
            wire.encode_hello_ok(
                self.version,
                {
                    "segmentId": meta.segment_id,
                    "range": {"start": meta.range_start, "end": meta.range_end},
                    "buckets": meta.buckets,
                    "lastSequenceId": seg.last_sequence_id(name),
                    "maxInflightBytes": self.window,
                    "maxEntryBytes": wire.MAX_ENTRY_SIZE,
                    "sealed": seg.seal is not None,
                },
            )
        )
        if seg.seal is not None:
            self.refused = True

    def _stop(self) -> None:
        if self.hosted is not None:
            if self.hosted.producers.get(self.producer_name) is self:
                del self.hosted.producers[self.producer_name]
            self.hosted.segment.listeners.discard(self._on_durable)
            self.hosted.segment.seal_listeners.discard(self._on_seal)

    def _on_durable(self, _position: int) -> None:
        if self.unacked:
            self.out_event.set()

    def _on_seal(self) -> None:
        assert self.hosted is not None
        if self.hosted.segment.failed:
            self.close_soon("InternalError", "segment log write failed", 1011)
        self.out_event.set()

    def _on_frame(self, data: bytes) -> None:
        if not data or data[0] != wire.FRAME_SEND:
            kind = "empty_frame" if not data else "unknown_frame"
            raise _protocol(kind, f"unexpected frame type {data[0] if data else None}")
        if self.refused:
            return
        assert self.hosted is not None
        seg = self.hosted.segment
        buckets = seg.meta.buckets
        unacked = self.unacked
        wake = False
        for entry, header in self._checked_entries(data):
            if (
                buckets > 1
                and header.keyed
                and wire.bucket_of(header.hashb_min, buckets)
                != wire.bucket_of(header.hashb_max, buckets)
            ):
                self.errors[header.sequence_id] = (
                    wire.ERR_ENTRY_SPANS_BUCKETS,
                    f"entry hashB {header.hashb_min:#06x}..{header.hashb_max:#06x} spans "
                    f"buckets of this segment ({buckets} buckets); batch per bucket",
                )
                unacked.append((header.sequence_id, -1, -1, 0))
                wake = True
                continue
            try:
                pos, dup = seg.append(entry, header)
            except SegmentSealedError:
                self.refused = True
                self.out_event.set()
                return
            except SegmentReleasingError:
                continue  # fenced for a transfer: not stored, not acknowledged, re-sent later
            except SegmentNotWritableError:
                raise _not_writable() from None
            except SegmentCorruptedError:
                # Like a seal: what was staged before is acknowledged, then ERROR and close.
                self.refused = True
                self.out_event.set()
                return
            except SegmentGoneError:
                raise _Closing(
                    "segment_gone",
                    wire.ERR_SEGMENT_DELETED,
                    "segment deleted",
                    wire.CLOSE_SEGMENT_DELETED,
                ) from None
            size = len(entry)
            unacked.append((header.sequence_id, pos, wire.ACK_STATUS_DUPLICATE if dup else 0, size))
            self.inflight_bytes += size
            if dup:
                wake = True
        if wake:
            self.out_event.set()
        if self.inflight_bytes > self.window:
            self.window_open.clear()

    def _checked_entries(self, data: bytes) -> list[tuple[memoryview, wire.EntryHeader]]:
        """Every entry of a SEND frame with its header, validated before any is staged: a
        malformed entry or one naming another producer refuses the whole frame (and closes
        the connection), so nothing of it is stored and no other producer's de-duplication
        state (its last sequence id) can be touched by this connection."""
        checked: list[tuple[memoryview, wire.EntryHeader]] = []
        for entry in wire.decode_send(data):
            header = wire.decode_entry_header(entry)
            if header.producer_name != self.producer_name:
                raise _protocol(
                    "wrong_producer",
                    f"entries must name producer {self.producer_name!r} (this connection's "
                    f"HELLO producerName), got {header.producer_name!r}",
                )
            checked.append((entry, header))
        return checked

    async def _after_frame(self) -> None:
        if not self.window_open.is_set():
            await self.window_open.wait()

    def _before_write(self) -> None:
        assert self.hosted is not None
        seg = self.hosted.segment
        visible = seg.visible_position
        unacked = self.unacked
        acks: list[tuple[int, int, int]] = []
        freed = 0
        while unacked and unacked[0][1] <= visible:
            seq, pos, status, size = unacked.popleft()
            if status < 0:
                if acks:
                    self.out.append(wire.encode_send_ack(acks))
                    acks = []
                code, message = self.errors.pop(seq)
                self.out.append(wire.encode_entry_error(seq, code, message))
                continue
            acks.append((seq, pos, status))
            freed += size
            if len(acks) == wire.MAX_FRAME_ITEMS:
                self.out.append(wire.encode_send_ack(acks))
                acks = []
        if acks:
            self.out.append(wire.encode_send_ack(acks))
        if freed:
            self.inflight_bytes -= freed
            if self.inflight_bytes <= self.window:
                self.window_open.set()
        if self.refused and seg.seal is None and seg.corruption is not None:
            if not unacked and self._close is None:
                closing = _corrupted(seg.corruption)
                self._close_extra = closing.extra
                self._close = (closing.code, str(closing), closing.close_code)
            return
        if (self.refused or seg.seal is not None) and not unacked and self._close is None:
            if seg.seal is None:
                if not self._waiting_for_seal:
                    self._waiting_for_seal = True
                    asyncio.get_running_loop().create_task(self._seal_later())
                return
            self.out.append(wire.encode_sealed(seg.seal.to_json()))
            self._close = (
                wire.ERR_SEGMENT_SEALED,
                "segment sealed",
                wire.CLOSE_SEGMENT_SEALED,
            )

    async def _seal_later(self) -> None:
        assert self.hosted is not None
        await self.hosted.segment.sealed_event.wait()
        self.out_event.set()


class ConsumerConnection(_Connection):
    """Push consumption of one subscription with permits."""

    role = "consumer"

    async def _admit(self) -> None:
        assert self.hosted is not None
        if not await hold_incoming(self.hosted, self.broker.config.fence_wait_s):
            raise _not_writable()

    def __init__(self, broker: Broker, ws: web.WebSocketResponse, request: web.Request) -> None:
        super().__init__(broker, ws, request)
        self.dispatcher: Dispatcher | None = None
        self.consumer: Consumer | None = None

    def _start(self, hello: dict[str, Any]) -> None:
        assert self.hosted is not None
        sub = self.request.match_info["subscription"]
        disp = self.hosted.dispatchers.get(sub)
        if disp is None:
            raise _Closing(
                "subscription_not_found",
                wire.ERR_SUBSCRIPTION_NOT_FOUND,
                f"no subscription {sub!r} on this segment",
                wire.CLOSE_SUBSCRIPTION_NOT_FOUND,
            )
        name = hello.get("consumerName")
        if not isinstance(name, str) or not name:
            raise _protocol("bad_hello", "HELLO needs a consumerName")
        buckets = hello.get("buckets")
        if buckets is not None and (
            not isinstance(buckets, list)
            or not all(isinstance(b, int) and not isinstance(b, bool) for b in buckets)
        ):
            raise _protocol("bad_hello", "buckets must be a list of integers")
        permits = hello.get("permits", 0)
        if not isinstance(permits, int) or isinstance(permits, bool) or permits < 0:
            raise _protocol("bad_hello", "permits must be a non-negative integer")
        if disp.type is SubscriptionType.EXCLUSIVE and self.version < 2:
            buckets = None  # version 1: an Exclusive subscription ignores buckets
        seg = self.hosted.segment
        meta = seg.meta
        self.send(
            wire.encode_hello_ok(
                self.version,
                {
                    "segmentId": meta.segment_id,
                    "range": {"start": meta.range_start, "end": meta.range_end},
                    "buckets": meta.buckets,
                    "subscriptionType": disp.type.value,
                    "ackFloor": disp.cursor.ack_floor,
                    "lastPosition": seg.servable_position,
                    "sealed": seg.seal is not None,
                    **(
                        {"corruption": seg.corruption.to_json()}
                        if seg.corruption is not None
                        else {}
                    ),
                },
            )
        )
        try:
            self.consumer = disp.attach(name, buckets, self)
        except DispatchError as exc:
            close = {
                "ConsumerBusy": wire.CLOSE_CONSUMER_BUSY,
                "BucketConflict": wire.CLOSE_BUCKET_CONFLICT,
            }.get(exc.code, wire.CLOSE_PROTOCOL_ERROR)
            self.out.clear()
            raise _Closing("bad_hello", exc.code, str(exc), close) from None
        self.dispatcher = disp
        if permits:
            disp.flow(self.consumer, permits)

    def _stop(self) -> None:
        if self.dispatcher is not None and self.consumer is not None:
            self.dispatcher.detach(self.consumer)

    # ConsumerSink
    def deliver(self, items: list[tuple[int, int, Any]]) -> None:
        for i in range(0, len(items), MAX_DELIVER_ITEMS):
            self.out.append(wire.encode_deliver(items[i : i + MAX_DELIVER_ITEMS]))
        self.out_event.set()

    def end_of_segment(self, last_position: int) -> None:
        self.send(wire.encode_end_of_segment(last_position))

    def end_of_buckets(self, last_position: int) -> None:
        if self.version >= 2:
            self.send(wire.encode_end_of_buckets(last_position))

    def corrupted(self, corruption: Corruption) -> None:
        closing = _corrupted(corruption)
        self.close_soon(closing.code, str(closing), closing.close_code, closing.extra)

    def _on_frame(self, data: bytes) -> None:
        disp = self.dispatcher
        consumer = self.consumer
        assert disp is not None and consumer is not None
        kind = wire.frame_type(data)
        try:
            if kind == wire.FRAME_FLOW:
                disp.flow(consumer, wire.decode_flow(data))
            elif kind == wire.FRAME_ACK:
                cumulative, positions = wire.decode_ack(data)
                disp.ack(consumer, positions, cumulative)
            elif kind == wire.FRAME_NACK:
                disp.nack(consumer, wire.decode_nack(data))
            else:
                raise _protocol("unknown_frame", f"unexpected frame type {kind}")
        except DispatchError as exc:
            raise _protocol("bad_ack", str(exc)) from None

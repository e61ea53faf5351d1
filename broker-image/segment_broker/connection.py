"""What every broker WebSocket connection shares (docs/protocol.md): the HELLO handshake,
ordered outgoing frames, and closing with an ERROR frame and a close code. A malformed frame
closes only its connection (close code 4000, counted in
``segment_broker_protocol_errors_total{kind}``). The produce and consume paths are
:mod:`.produce` and :mod:`.consume`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any, Protocol

from aiohttp import WSMsgType, web

from scalable_topics.core import wire
from scalable_topics.core.wire import WireError

from .config import BrokerConfig
from .metrics import BrokerMetrics
from .routes import segment_key
from .storage.log import Corruption
from .store import HostedSegment, NotFoundError, SegmentStore

log = logging.getLogger(__name__)

HELLO_TIMEOUT = 10.0
CLOSE_TIMEOUT = 2.0
"""How long a close waits for the peer's close frame (a gone peer must not stall shutdown)."""


class Closing(Exception):
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


def close_reason(message: str) -> bytes:
    """A WebSocket close reason holds at most 123 bytes: cut on a UTF-8 character boundary
    (the ERROR frame before the close carries the whole message)."""
    return message.encode()[:120].decode(errors="ignore").encode()


def protocol_error(kind: str, message: str) -> Closing:
    return Closing(kind, wire.ERR_PROTOCOL, message, wire.CLOSE_PROTOCOL_ERROR)


def corrupted_error(corruption: Corruption) -> Closing:
    """``ERROR SegmentCorrupted {position}``, close 4010: the segment is quarantined."""
    return Closing(
        "corrupted",
        wire.ERR_SEGMENT_CORRUPTED,
        f"segment corrupted at position {corruption.position} ({corruption.reason}); it is "
        "quarantined until an operator truncates it",
        wire.CLOSE_SEGMENT_CORRUPTED,
        {"position": corruption.position},
    )


def not_writable_error() -> Closing:
    return Closing(
        "not_writable",
        wire.ERR_SEGMENT_NOT_WRITABLE,
        "segment not writable yet (its parents are being sealed); retry",
        wire.CLOSE_SEGMENT_NOT_WRITABLE,
    )


class ConnectionHost(Protocol):
    """What a connection needs of the broker serving it (:class:`.server.Broker`)."""

    config: BrokerConfig
    metrics: BrokerMetrics
    store: SegmentStore
    connections: set[Connection]


class Connection:
    """Common WebSocket plumbing: HELLO, ordered outgoing frames, protocol-error closes."""

    role = "?"

    def __init__(
        self, broker: ConnectionHost, ws: web.WebSocketResponse, request: web.Request
    ) -> None:
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
            raise protocol_error("hello_timeout", "no HELLO within 10 s") from None
        if msg.type != WSMsgType.BINARY:
            if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                raise Closing("peer_closed", "Closed", "closed before HELLO", 1000)
            raise protocol_error("text_frame", "expected a binary HELLO frame")
        version, body = wire.decode_hello(msg.data)
        if version < wire.MIN_PROTOCOL_VERSION:
            raise Closing(
                "version",
                wire.ERR_UNSUPPORTED_VERSION,
                f"protocol version {version} unsupported (server speaks "
                f"{wire.MIN_PROTOCOL_VERSION}..{wire.PROTOCOL_VERSION})",
                wire.CLOSE_UNSUPPORTED_VERSION,
            )
        self.version = min(version, wire.PROTOCOL_VERSION)
        key = segment_key(self.request)
        try:
            self.hosted = self.broker.store.get(*key)
        except NotFoundError as exc:
            raise Closing(
                "segment_not_found",
                wire.ERR_SEGMENT_NOT_FOUND,
                str(exc),
                wire.CLOSE_SEGMENT_NOT_FOUND,
            ) from None
        return body

    async def serve(self) -> None:
        self.broker.connections.add(self)
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
        except Closing as exc:
            await self._fail(exc)
        except WireError as exc:
            await self._fail(protocol_error(exc.kind, str(exc)))
        except asyncio.CancelledError:
            if self._close is None:
                raise
        except Exception:
            log.exception("%s connection failed", self.role)
            await self._fail(Closing("internal", "InternalError", "internal error", 1011))
        finally:
            self._stop()
            if self._close is not None and not self.ws.closed:
                code, message, close_code = self._close
                await self._flush_out()
                with contextlib.suppress(Exception):
                    await self.ws.send_bytes(wire.encode_error(code, message, **self._close_extra))
                    await self.ws.close(code=close_code, message=close_reason(message))
            if writer is not None:
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await writer
            if self.hosted is not None:
                self.hosted.connections.discard(self)
            self.broker.connections.discard(self)
            if not self.ws.closed:
                with contextlib.suppress(Exception):
                    await self.ws.close()
            self.done.set()

    async def _flush_out(self) -> None:
        while self.out and not self.ws.closed:
            with contextlib.suppress(Exception):
                await self.ws.send_bytes(self.out.popleft())

    async def _fail(self, exc: Closing) -> None:
        if exc.close_code == wire.CLOSE_PROTOCOL_ERROR:
            self.metrics.protocol_errors.labels(exc.kind).inc()
            log.info("%s protocol error (%s): %s", self.role, exc.kind, exc)
        if self.ws.closed:
            return
        with contextlib.suppress(Exception):
            await self.ws.send_bytes(wire.encode_error(exc.code, str(exc), **exc.extra))
            await self.ws.close(code=exc.close_code, message=close_reason(str(exc)))

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
                raise protocol_error("bad_websocket", f"WebSocket error: {ws.exception()}")
            else:
                raise protocol_error("text_frame", "only binary frames are allowed")

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

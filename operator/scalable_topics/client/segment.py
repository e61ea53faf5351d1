"""Low-level asyncio client of the segment broker: produce, consume, admin (docs/protocol.md).

One :class:`SegmentProducer` / :class:`SegmentConsumer` talks to one segment over one WebSocket.
The SDK builds key routing, DAG following and consumer assignment on top of these.

Producing::

    producer = await SegmentProducer.connect(url, "ns", "orders", 0, "producer-1")
    fut = await producer.send_entry([Message(b"value", key=b"customer-7")])  # waits for window
    ack = await fut                                                          # EntryAck(position)

A :class:`SegmentProducer` sends entries, it does not batch: each call is one entry (the
caller's messages, ``send_entry``; a payload the caller encoded, ``send_encoded``; or an encoded
entry under the caller's sequence id, ``publish``), with at most ``max_inflight_bytes`` of them
unacknowledged. Batching messages into entries, per entry bucket, is the job of the SDK's
:class:`~scalable_topics.client.producer.ScalableTopicProducer`, whose per-segment batches
outlive a connection and are re-sent (``publish``) or re-routed. When the segment is sealed
every unacknowledged entry's future fails with :class:`SegmentSealedError`, which carries the
successors and the unacknowledged entries (in order) so the caller can re-route them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Generator,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any

import aiohttp

from scalable_topics.brokeradmin import AdminError, SegmentAdmin
from scalable_topics.core import auth, transfer, wire
from scalable_topics.core.wire import EntryHeader, Message, Successor
from scalable_topics.credentials import (
    TLS_VERIFICATION_FAILED,
    client_session,
    tls_failure_message,
)

__all__ = [
    "CLOSE_TIMEOUT",
    "WS_TIMEOUT",
    "AccessDeniedError",
    "AdminError",
    "ConnectionClosedError",
    "EntryAck",
    "EntryRejectedError",
    "ProtocolError",
    "ReceivedEntry",
    "SegmentAdmin",
    "SegmentConsumer",
    "SegmentCorruptedError",
    "SegmentError",
    "SegmentMovedError",
    "SegmentNotFoundError",
    "SegmentNotWritableError",
    "SegmentProducer",
    "SegmentSealedError",
    "Successor",
    "TLSVerificationError",
    "UnackedEntry",
    "close_websocket",
]


# --- errors --------------------------------------------------------------------------------------


class SegmentError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class UnackedEntry:
    """An entry the broker did not acknowledge; publish it again (:meth:`SegmentProducer.publish`
    with the same producer name and sequence id, so a copy that did get stored is recognised as
    a duplicate) or re-route its messages."""

    sequence_id: int
    entry: bytes

    def messages(self) -> list[Message]:
        return wire.decode_entry(self.entry)[1]


class _FailureWithEntries(SegmentError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)
        self.unacked: list[UnackedEntry] = []


class SegmentSealedError(_FailureWithEntries):
    """The segment is sealed; route to ``successors``. ``unacked`` lists the entries of this
    producer that were not stored, in send order."""

    def __init__(self, last_position: int, successors: list[Successor]) -> None:
        super().__init__(wire.ERR_SEGMENT_SEALED, "segment sealed")
        self.last_position = last_position
        self.successors = successors


class ConnectionClosedError(_FailureWithEntries):
    """The connection ended without a verdict for ``unacked``: resend them (deduplicated)."""


class SegmentMovedError(ConnectionClosedError):
    """The segment's ownership moved to the broker at ``url`` (an ownership transfer's close
    frame, docs/protocol.md): reconnect there at once and resend ``unacked`` (deduplicated)."""

    def __init__(self, code: str, message: str, url: str) -> None:
        super().__init__(code, message)
        self.url = url


class SegmentNotFoundError(SegmentError):
    pass


class SegmentNotWritableError(SegmentError):
    """The segment is fenced: a split or merge child whose parents are still being sealed.
    Retry shortly; the controller activates it right after the seal."""


class SegmentCorruptedError(SegmentError):
    """The segment's log is damaged at ``position`` and the broker quarantined it: it takes no
    writes, and a consumer got everything before ``position``. Retrying cannot help until an
    operator repairs the segment (docs/operations.md, "Corrupted segments")."""

    def __init__(self, code: str, message: str, position: int | None) -> None:
        super().__init__(code, message)
        self.position = position


class ProtocolError(SegmentError):
    pass


class AccessDeniedError(SegmentError):
    """The server refused the credentials: ``Unauthenticated`` (no token, or one that is
    invalid, expired or for another audience) or ``Forbidden`` (RBAC does not grant the verb;
    the message names it). Retrying does not help until the token or the RoleBindings change
    (docs/security.md)."""


class TLSVerificationError(AccessDeniedError):
    """A server's certificate did not verify against the CA bundle (code
    ``TLSVerificationFailed``): the wrong bundle, none, or a certificate for another host. Handled
    as a refusal, never retried: a reconnect meets the same certificate (docs/security.md)."""


async def ws_connect(
    session: aiohttp.ClientSession, url: str, **options: Any
) -> aiohttp.ClientWebSocketResponse:
    """``session.ws_connect`` raising :class:`TLSVerificationError` for a certificate that does
    not verify, which aiohttp reports as one more connection error."""
    try:
        ws: aiohttp.ClientWebSocketResponse = await session.ws_connect(url, **options)
    except aiohttp.ClientConnectorCertificateError as exc:
        raise TLSVerificationError(TLS_VERIFICATION_FAILED, tls_failure_message(url, exc)) from exc
    return ws


class EntryRejectedError(SegmentError):
    def __init__(self, sequence_id: int, code: str, message: str) -> None:
        super().__init__(code, message)
        self.sequence_id = sequence_id


def _error_from(body: Mapping[str, Any], close_code: int | None) -> SegmentError:
    code = str(body.get("code", "Closed"))
    message = str(body.get("message", f"closed with code {close_code}"))
    if code in (auth.ERR_UNAUTHENTICATED, auth.ERR_FORBIDDEN) or close_code in (
        auth.CLOSE_UNAUTHENTICATED,
        auth.CLOSE_FORBIDDEN,
    ):
        return AccessDeniedError(code, message)
    if code == wire.ERR_SEGMENT_NOT_FOUND or close_code == wire.CLOSE_SEGMENT_NOT_FOUND:
        return SegmentNotFoundError(code, message)
    moved = transfer.moved_to(body, close_code)
    if moved is not None:
        return SegmentMovedError(code, message, moved)
    if code == wire.ERR_PROTOCOL or close_code == wire.CLOSE_PROTOCOL_ERROR:
        return ProtocolError(code, message)
    if code == wire.ERR_SEGMENT_NOT_WRITABLE or close_code == wire.CLOSE_SEGMENT_NOT_WRITABLE:
        return SegmentNotWritableError(code, message)
    if code == wire.ERR_SEGMENT_CORRUPTED or close_code == wire.CLOSE_SEGMENT_CORRUPTED:
        position = body.get("position")
        return SegmentCorruptedError(
            code, message, position if isinstance(position, int) and position >= 0 else None
        )
    return ConnectionClosedError(code, message)


def _ws_base(url: str) -> str:
    url = url.rstrip("/")
    if url.startswith("http://"):
        return "ws://" + url[7:]
    if url.startswith("https://"):
        return "wss://" + url[8:]
    return url


CLOSE_TIMEOUT = 0.5
"""Seconds a closing WebSocket of the SDK waits for the peer's close frame before it drops the
connection: a hung or unreachable peer cannot hold up a close (``docs/client.md``)."""

WS_TIMEOUT = aiohttp.ClientWSTimeout(ws_close=CLOSE_TIMEOUT)
"""``timeout=`` of every WebSocket the SDK opens."""


async def close_websocket(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Close ``ws`` within about :data:`CLOSE_TIMEOUT`, whatever the peer does (writing the
    close frame itself can block on a peer that stopped reading)."""
    closing = asyncio.ensure_future(ws.close())
    _, late = await asyncio.wait({closing}, timeout=CLOSE_TIMEOUT * 2)
    for task in late:
        task.cancel()
    await asyncio.gather(closing, return_exceptions=True)


class _Session:
    """Owns an aiohttp session unless the caller passed one."""

    def __init__(self, session: aiohttp.ClientSession | None) -> None:
        self.owned = session is None
        self.session = session or client_session()

    async def close(self) -> None:
        if self.owned:
            await self.session.close()


async def _handshake(
    ws: aiohttp.ClientWebSocketResponse, hello: Mapping[str, Any]
) -> tuple[int, dict[str, Any]]:
    """The negotiated protocol version and the ``HELLO_OK`` body."""
    await ws.send_bytes(wire.encode_hello(wire.PROTOCOL_VERSION, hello))
    msg = await ws.receive()
    if msg.type == aiohttp.WSMsgType.BINARY and msg.data[:1] == bytes((wire.FRAME_HELLO_OK,)):
        return wire.decode_hello_ok(msg.data)
    if msg.type == aiohttp.WSMsgType.BINARY and msg.data[:1] == bytes((wire.FRAME_ERROR,)):
        body = wire.decode_json_frame(msg.data)
        with contextlib.suppress(Exception):
            await ws.receive()
        code = str(body.get("code"))
        if code in ("ConsumerBusy", "BucketConflict", "SubscriptionNotFound"):
            raise SegmentError(code, str(body.get("message")))
        raise _error_from(body, ws.close_code)
    raise ConnectionClosedError("Closed", f"connection closed during handshake ({ws.close_code})")


# --- producer ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EntryAck:
    sequence_id: int
    position: int
    duplicate: bool
    """The broker already had this entry (a retry); ``position`` is the original one, or -1
    when the original is older than the broker's dedup history."""


@dataclass(slots=True)
class _Pending:
    sequence_id: int
    entry: bytes
    future: asyncio.Future[EntryAck]


class SegmentProducer:
    def __init__(
        self,
        ws: aiohttp.ClientWebSocketResponse,
        session: _Session,
        producer_name: str,
        hello: Mapping[str, Any],
        *,
        max_inflight_bytes: int | None,
        version: int = wire.PROTOCOL_VERSION,
    ) -> None:
        self._ws = ws
        self._session = session
        self.version = version
        """The negotiated protocol version."""
        self.on_sealing: Callable[[list[Successor]], None] | None = None
        """Called with the successors when the broker begins sealing the segment (``SEALING``,
        version 5). A hint: the seal may still fail, and ``SEALED`` is the verdict."""
        self.producer_name = producer_name
        self._name_bytes = producer_name.encode("utf-8")
        self.segment_id = int(hello["segmentId"])
        self.range = (int(hello["range"]["start"]), int(hello["range"]["end"]))
        self.buckets = int(hello.get("buckets", 1))
        self.last_sequence_id = int(hello.get("lastSequenceId", -1))
        """The highest sequence id of this producer name the broker stored (at the handshake)
        or that was sent since."""
        self._last_sent = -1
        """The sequence id of the last entry sent on this connection."""
        server_window = int(hello.get("maxInflightBytes", 8 << 20))
        self.max_inflight_bytes = min(max_inflight_bytes or server_window, server_window)
        self.max_entry_bytes = int(hello.get("maxEntryBytes", wire.MAX_ENTRY_SIZE))
        self._loop = asyncio.get_running_loop()
        self._pending: deque[_Pending] = deque()
        self._inflight_bytes = 0
        self._window = asyncio.Event()
        self._window.set()
        self._failure: SegmentError | None = None
        self._failed = asyncio.Event()
        self._closing = False
        self._reader = self._loop.create_task(self._read_loop())
        if bool(hello.get("sealed")):
            self._window.clear()

    @classmethod
    async def connect(
        cls,
        url: str,
        namespace: str,
        topic: str,
        segment_id: int,
        producer_name: str,
        *,
        session: aiohttp.ClientSession | None = None,
        max_inflight_bytes: int | None = None,
    ) -> SegmentProducer:
        sess = _Session(session)
        try:
            ws = await ws_connect(
                sess.session,
                f"{_ws_base(url)}/ws/v1/produce/{namespace}/{topic}/{segment_id}",
                max_msg_size=64 << 20,
                compress=0,
                autoping=True,
                timeout=WS_TIMEOUT,
            )
            version, hello = await _handshake(ws, {"producerName": producer_name})
        except BaseException:
            await sess.close()
            raise
        return cls(
            ws, sess, producer_name, hello, max_inflight_bytes=max_inflight_bytes, version=version
        )

    # --- sending -------------------------------------------------------------------------------

    async def send_entry(
        self, messages: Sequence[Message], *, sequence_id: int | None = None
    ) -> asyncio.Future[EntryAck]:
        """Send ``messages`` as one entry; ``sequence_id`` (default: the next one) must be above
        :attr:`last_sequence_id`."""
        await self._wait_window()
        seq = self._take_seq(sequence_id)
        entry = wire.encode_entry(
            self.producer_name, seq, messages, publish_time_ms=int(time.time() * 1000)
        )
        return self._transmit(seq, entry)

    async def send_encoded(
        self,
        payload: bytes,
        count: int,
        hashb_min: int,
        hashb_max: int,
        key_hash_sample: int | None,
        keyed: bool,
        *,
        sequence_id: int | None = None,
    ) -> asyncio.Future[EntryAck]:
        """Fastest path: a payload from ``wire.encode_keyed_values``/``encode_values``."""
        await self._wait_window()
        seq = self._take_seq(sequence_id)
        entry = wire.encode_entry_raw(
            self._name_bytes,
            seq,
            payload,
            count,
            hashb_min=hashb_min,
            hashb_max=hashb_max,
            keyed=keyed,
            key_hash_sample=key_hash_sample,
            publish_time_ms=int(time.time() * 1000),
        )
        return self._transmit(seq, entry)

    async def publish(self, sequence_id: int, entry: bytes) -> asyncio.Future[EntryAck]:
        """Send an entry the caller encoded under ``sequence_id`` (its header's), waiting only
        for window space; the future resolves with the broker's acknowledgement.

        The first send of an entry and the re-send of one a lost connection left without a
        verdict are the same call: the broker stores an entry whose sequence id is above the
        last one it stored for the producer name and answers a lower one as a duplicate, with
        the original position. So the ids sent on one connection must increase: a lower id
        after a higher one would be acknowledged as a duplicate without being stored, and is
        refused here (``ValueError``) before anything is sent."""
        await self._wait_window()
        if sequence_id <= self._last_sent:
            raise ValueError(
                f"sequence id {sequence_id} is not above {self._last_sent}, the last one sent "
                "on this connection: the broker would answer it as a duplicate"
            )
        return self._transmit(sequence_id, entry)

    def _take_seq(self, sequence_id: int | None) -> int:
        if sequence_id is None:
            return self.last_sequence_id + 1
        if sequence_id <= self.last_sequence_id:
            raise ValueError(
                f"sequence id {sequence_id} is not above the last one {self.last_sequence_id}"
            )
        return sequence_id

    def _transmit(self, seq: int, entry: bytes) -> asyncio.Future[EntryAck]:
        """Send one entry (the window was awaited); every send goes through here."""
        if len(entry) > self.max_entry_bytes:
            # Sent anyway it would close the connection with a protocol error.
            raise ValueError(
                f"entry {seq} has {len(entry)} bytes, more than the broker's {self.max_entry_bytes}"
            )
        frame = wire.encode_send([entry])
        future: asyncio.Future[EntryAck] = self._loop.create_future()
        self._pending.append(_Pending(seq, entry, future))
        self._inflight_bytes += len(entry)
        self._last_sent = seq
        self.last_sequence_id = max(self.last_sequence_id, seq)
        if self._inflight_bytes >= self.max_inflight_bytes:
            self._window.clear()
        try:
            task = send_now(self._ws, frame)
        except Exception as exc:
            self._fail(ConnectionClosedError("Closed", f"send failed: {exc}"))
        else:
            if task is not None:
                task.add_done_callback(self._sent)
        return future

    def _sent(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._fail(ConnectionClosedError("Closed", f"send failed: {task.exception()}"))

    async def _wait_window(self) -> None:
        while not self._window.is_set():
            if self._failure is not None:
                raise self._failure
            await self._window.wait()
        if self._failure is not None:
            raise self._failure

    async def flush(self) -> None:
        """Wait until every entry sent so far is acknowledged."""
        futs = [p.future for p in self._pending]
        if futs:
            await asyncio.gather(*futs)

    @property
    def inflight_entries(self) -> int:
        return len(self._pending)

    # --- receiving -----------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        ws = self._ws
        failure: SegmentError | None = None
        try:
            while True:
                msg = await ws.receive()
                if msg.type != aiohttp.WSMsgType.BINARY:
                    break
                data = msg.data
                kind = data[0] if data else -1
                if kind == wire.FRAME_SEND_ACK:
                    self._on_acks(wire.decode_send_ack(data))
                elif kind == wire.FRAME_ENTRY_ERROR:
                    body = wire.decode_json_frame(data)
                    self._on_entry_error(body)
                elif kind == wire.FRAME_SEALING:
                    successors = wire.decode_sealing(data)
                    if self.on_sealing is not None:
                        self.on_sealing(successors)
                elif kind == wire.FRAME_SEALED:
                    body = wire.decode_json_frame(data)
                    failure = SegmentSealedError(
                        int(body.get("lastPosition", -1)),
                        [Successor.from_json(s) for s in body.get("successors", [])],
                    )
                    break
                elif kind == wire.FRAME_ERROR:
                    failure = _error_from(wire.decode_json_frame(data), ws.close_code)
                    break
                else:
                    failure = ProtocolError(wire.ERR_PROTOCOL, f"unexpected frame type {kind}")
                    break
        except (wire.WireError, KeyError, ValueError) as exc:
            failure = ProtocolError(wire.ERR_PROTOCOL, str(exc))
        except asyncio.CancelledError:
            failure = ConnectionClosedError("Closed", "producer closed")
        except Exception as exc:
            failure = ConnectionClosedError("Closed", str(exc))
        if failure is None:
            failure = ConnectionClosedError("Closed", f"connection closed ({ws.close_code})")
        self._fail(failure)
        if not ws.closed:
            with contextlib.suppress(Exception):
                await ws.close()

    def _on_acks(self, acks: list[wire.SendAck]) -> None:
        pending = self._pending
        freed = 0
        for ack in acks:
            if not pending or pending[0].sequence_id != ack.sequence_id:
                raise wire.WireError("ack_order", f"unexpected ack for {ack.sequence_id}")
            p = pending.popleft()
            freed += len(p.entry)
            if not p.future.done():
                p.future.set_result(EntryAck(ack.sequence_id, ack.position, ack.duplicate))
        self._inflight_bytes -= freed
        if self._inflight_bytes < self.max_inflight_bytes and self._failure is None:
            self._window.set()

    def _on_entry_error(self, body: Mapping[str, Any]) -> None:
        seq = int(body.get("sequenceId", -1))
        pending = self._pending
        if not pending or pending[0].sequence_id != seq:
            raise wire.WireError("ack_order", f"unexpected entry error for {seq}")
        p = pending.popleft()
        self._inflight_bytes -= len(p.entry)
        if not p.future.done():
            p.future.set_exception(
                EntryRejectedError(seq, str(body.get("code")), str(body.get("message")))
            )
        self._window.set()

    def _fail(self, error: SegmentError) -> None:
        if self._failure is not None:
            return
        if isinstance(error, _FailureWithEntries):
            error.unacked = [UnackedEntry(p.sequence_id, p.entry) for p in self._pending]
        self._failure = error
        self._failed.set()
        while self._pending:
            p = self._pending.popleft()
            if not p.future.done():
                p.future.set_exception(error)
                p.future.exception()
        self._window.set()

    @property
    def failure(self) -> SegmentError | None:
        return self._failure

    async def wait_failed(self) -> SegmentError:
        """Wait until the connection ends (sealed, deleted, lost) and return why."""
        await self._failed.wait()
        assert self._failure is not None
        return self._failure

    async def close(self, *, flush: bool = True) -> None:
        """Wait for the acks (``flush=False``: at once), close. Failed entries stay
        failed; with ``flush=False`` the unacknowledged ones fail with
        :class:`ConnectionClosedError` (listed in its ``unacked``)."""
        if not self._closing:
            self._closing = True
            if self._failure is None and flush:
                with contextlib.suppress(SegmentError):
                    await self.flush()
            await close_websocket(self._ws)
            try:
                await _cancel_and_wait(self._reader)
            finally:
                await self._session.close()

    async def __aenter__(self) -> SegmentProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# --- consumer ------------------------------------------------------------------------------------


_NONE_ACKED: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class ReceivedEntry:
    position: int
    redelivery_count: int
    entry: bytes | memoryview
    acked: frozenset[int] = _NONE_ACKED
    """Batch indexes of messages acknowledged before (protocol v4 ``ACKED_INDEXES``): a
    previous consumer took them and left in the middle of the entry; they are not handed out."""

    @property
    def header(self) -> EntryHeader:
        return wire.decode_entry_header(self.entry)

    def messages(self) -> list[Message]:
        return wire.decode_entry(self.entry)[1]


class SegmentConsumer:
    """Receives entries of one subscription; flow control is automatic (``permits`` entries
    are requested up front and replenished as the application takes them)."""

    def __init__(
        self,
        ws: aiohttp.ClientWebSocketResponse,
        session: _Session,
        hello: Mapping[str, Any],
        permits: int,
        *,
        version: int = wire.PROTOCOL_VERSION,
    ) -> None:
        self._ws = ws
        self.version = version
        """The protocol version negotiated with the broker."""
        self._session = session
        self.segment_id = int(hello["segmentId"])
        self.buckets = int(hello.get("buckets", 1))
        self.subscription_type = str(hello.get("subscriptionType"))
        self.ack_floor = int(hello.get("ackFloor", 0))
        self.servable_position = int(hello.get("lastPosition", -1))
        """The last position the broker could serve at the handshake."""
        corruption = hello.get("corruption")
        self.corruption: dict[str, Any] | None = (
            dict(corruption) if isinstance(corruption, dict) else None
        )
        """Set when the segment is quarantined: ``position`` is where delivery will stop."""
        self.permits = permits
        self._loop = asyncio.get_running_loop()
        self._queue: deque[ReceivedEntry] = deque()
        self._ready = asyncio.Event()
        self._taken_since_flow = 0
        self._acks: list[int] = []
        self._acked_indexes: wire.PartialAcks = {}
        """From ``ACKED_INDEXES``, for the entries of the ``DELIVER`` frame that follows."""
        self._cumulative: int | None = None
        self._ack_scheduled = False
        self.end_of_segment = False
        self.end_of_buckets = False
        """Protocol v2: every entry of the buckets named in ``HELLO`` up to the seal was
        delivered (queued here); ``last_position`` is the seal's last position."""
        self.buckets_done: set[int] = set()
        """Protocol v3: buckets named in ``HELLO`` every entry of which up to the seal is
        acknowledged by the subscription (``BUCKETS_DONE``)."""
        self.last_position: int | None = None
        self.failure: SegmentError | None = None
        self._closing: asyncio.Future[None] | None = None
        self._reader = self._loop.create_task(self._read_loop())

    @classmethod
    async def connect(
        cls,
        url: str,
        namespace: str,
        topic: str,
        segment_id: int,
        subscription: str,
        consumer_name: str,
        *,
        buckets: Sequence[int] | None = None,
        permits: int = 1000,
        session: aiohttp.ClientSession | None = None,
    ) -> SegmentConsumer:
        sess = _Session(session)
        ws: aiohttp.ClientWebSocketResponse | None = None
        try:
            ws = await ws_connect(
                sess.session,
                f"{_ws_base(url)}/ws/v1/consume/{namespace}/{topic}/{segment_id}/{subscription}",
                max_msg_size=128 << 20,
                compress=0,
                timeout=WS_TIMEOUT,
            )
            version, hello = await _handshake(
                ws,
                {
                    "consumerName": consumer_name,
                    "buckets": list(buckets) if buckets is not None else None,
                    "permits": permits,
                },
            )
        except BaseException:
            # Cancelled mid-handshake (a hand-over stops the reader): a connection left open
            # would keep this consumer attached - and its buckets held - until the broker's
            # heartbeat gave up on it.
            if ws is not None:
                with contextlib.suppress(Exception):
                    await ws.close()
            await sess.close()
            raise
        return cls(ws, sess, hello, permits, version=version)

    async def _read_loop(self) -> None:
        ws = self._ws
        try:
            while True:
                msg = await ws.receive()
                if msg.type != aiohttp.WSMsgType.BINARY:
                    break
                data = msg.data
                kind = data[0] if data else -1
                if kind == wire.FRAME_DELIVER:
                    acked = self._acked_indexes
                    for d in wire.decode_deliver(data):
                        self._queue.append(
                            ReceivedEntry(
                                d.position,
                                d.redelivery_count,
                                d.entry,
                                acked.pop(d.position, _NONE_ACKED) if acked else _NONE_ACKED,
                            )
                        )
                    acked.clear()
                elif kind == wire.FRAME_ACKED_INDEXES:
                    self._acked_indexes.update(wire.decode_acked_indexes(data))
                    continue
                elif kind == wire.FRAME_END_OF_SEGMENT:
                    self.last_position = wire.decode_end_of_segment(data)
                    self.end_of_segment = True
                elif kind == wire.FRAME_END_OF_BUCKETS:
                    self.last_position = wire.decode_end_of_buckets(data)
                    self.end_of_buckets = True
                elif kind == wire.FRAME_BUCKETS_DONE:
                    self.last_position, done = wire.decode_buckets_done(data)
                    self.buckets_done.update(done)
                elif kind == wire.FRAME_ERROR:
                    self.failure = _error_from(wire.decode_json_frame(data), ws.close_code)
                    break
                else:
                    self.failure = ProtocolError(wire.ERR_PROTOCOL, f"unexpected frame {kind}")
                    break
                self._ready.set()
        except wire.WireError as exc:
            self.failure = ProtocolError(wire.ERR_PROTOCOL, str(exc))
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            self.failure = ConnectionClosedError("Closed", str(exc))
        if self.failure is None and not self.end_of_segment:
            self.failure = ConnectionClosedError("Closed", f"connection closed ({ws.close_code})")
        self._ready.set()
        if not ws.closed:
            with contextlib.suppress(Exception):
                await ws.close()

    async def receive(self) -> ReceivedEntry | None:
        """The next entry; None once the segment is sealed and fully acknowledged (end of
        segment). Raises the connection's failure when it ends otherwise."""
        while not self._queue:
            if self.end_of_segment:
                return None
            if self.failure is not None:
                raise self.failure
            self._ready.clear()
            await self._ready.wait()
        item = self._queue.popleft()
        self._taken_since_flow += 1
        if self._taken_since_flow * 2 >= self.permits:
            n = self._taken_since_flow
            self._taken_since_flow = 0
            self._send(wire.encode_flow(n))
        return item

    def receive_nowait(self, max_entries: int) -> list[ReceivedEntry]:
        """Up to ``max_entries`` already received entries without waiting."""
        out: list[ReceivedEntry] = []
        q = self._queue
        while q and len(out) < max_entries:
            out.append(q.popleft())
        if out:
            self._taken_since_flow += len(out)
            if self._taken_since_flow * 2 >= self.permits:
                n = self._taken_since_flow
                self._taken_since_flow = 0
                self._send(wire.encode_flow(n))
        return out

    @property
    def queued(self) -> int:
        """Entries received and not taken yet."""
        return len(self._queue)

    async def wait_ready(self) -> None:
        """Wait until entries are queued, the segment (or the named buckets) ended, or the
        connection failed."""
        if self._queue or self.end_of_segment or self.end_of_buckets or self.failure is not None:
            return
        self._ready.clear()
        await self._ready.wait()

    async def wait_frame(self) -> None:
        """Wait for the next frame from the broker (or the connection's end): check the state,
        then wait, with nothing awaited in between."""
        if self.end_of_segment or self.failure is not None:
            return
        self._ready.clear()
        await self._ready.wait()

    def __aiter__(self) -> AsyncIterator[ReceivedEntry]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ReceivedEntry]:
        while True:
            item = await self.receive()
            if item is None:
                return
            yield item

    def _send(self, frame: bytes) -> None:
        if self._ws.closed:
            return
        try:
            task = send_now(self._ws, frame)
        except Exception:
            return  # the connection is going: the reader sees it end
        if task is not None:
            task.add_done_callback(_ignore_result)

    def ack(self, position: int) -> None:
        """Acknowledge one entry (batched: sent at the end of the current loop iteration)."""
        self._acks.append(position)
        if len(self._acks) >= 4096:
            self._flush_acks()
        elif not self._ack_scheduled:
            self._ack_scheduled = True
            self._loop.call_soon(self._flush_acks)

    def ack_many(self, positions: Sequence[int]) -> None:
        for p in positions:
            self.ack(p)

    def ack_cumulative(self, position: int) -> None:
        """Acknowledge everything up to ``position`` (Exclusive subscriptions only).

        Coalesced: only the highest position acknowledged during one loop iteration is sent.
        """
        if self._cumulative is None or position > self._cumulative:
            self._cumulative = position
        if not self._ack_scheduled:
            self._ack_scheduled = True
            self._loop.call_soon(self._flush_acks)

    def ack_partial(self, partial: Mapping[int, Iterable[int]]) -> None:
        """Acknowledge some messages of entries by batch index (protocol v4; an older broker
        redelivers those entries whole). Sent at once: the caller is about to let go of them."""
        if self.version < 4 or not partial:
            return
        self._flush_acks()
        items = list(partial.items())
        for i in range(0, len(items), wire.MAX_FRAME_ITEMS):
            self._send(wire.encode_partial_ack(dict(items[i : i + wire.MAX_FRAME_ITEMS])))

    def nack(self, positions: Sequence[int]) -> None:
        """Give entries back for redelivery."""
        self._flush_acks()
        for i in range(0, len(positions), wire.MAX_FRAME_ITEMS):
            self._send(wire.encode_nack(positions[i : i + wire.MAX_FRAME_ITEMS]))

    def _flush_acks(self) -> None:
        self._ack_scheduled = False
        if self._cumulative is not None:
            self._send(wire.encode_ack([self._cumulative], cumulative=True))
            self._cumulative = None
        acks = self._acks
        if not acks:
            return
        self._acks = []
        for i in range(0, len(acks), wire.MAX_FRAME_ITEMS):
            self._send(wire.encode_ack(acks[i : i + wire.MAX_FRAME_ITEMS]))

    async def close(self) -> None:
        """Send the last acknowledgements and close the connection. A caller cancelled
        meanwhile still gets the connection closed: left open, the broker would keep this
        consumer attached (its buckets held, the next owner refused) for as long as the
        connection answers its heartbeats."""
        closing = self._closing
        if closing is None:
            closing = self._closing = asyncio.ensure_future(self._close())
            closing.add_done_callback(_ignore_result)
        await asyncio.shield(closing)

    async def _close(self) -> None:
        self._flush_acks()
        await asyncio.sleep(0)
        with contextlib.suppress(Exception):
            await close_websocket(self._ws)
        try:
            await _cancel_and_wait(self._reader)
        finally:
            await self._session.close()

    async def __aenter__(self) -> SegmentConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended. Only the task's own cancellation is
    absorbed: if the caller is being cancelled meanwhile, that still propagates."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


def send_now(ws: aiohttp.ClientWebSocketResponse, frame: bytes) -> asyncio.Task[None] | None:
    """Write ``frame`` now, in call order, without a task per frame.

    aiohttp writes an uncompressed frame into the transport synchronously and only then, past
    its buffer limit with the transport paused, waits for the drain. So the send coroutine is
    run to its first suspension here: usually it finishes (the frame is in the socket's
    buffer when this returns, not one loop iteration later as with a task, which is a hop of
    up to a millisecond on a busy loop); a send that waits for the drain goes on in the task
    returned. Its failure to write raises here."""
    coro = ws.send_bytes(frame)
    try:
        awaiting = coro.send(None)
    except StopIteration:
        return None
    except BaseException:
        coro.close()
        raise
    blocking = getattr(awaiting, "_asyncio_future_blocking", None)
    if blocking:
        # What a task does with a future its coroutine yields: the drain waiter is shared, and
        # another send awaiting it before this task runs must find it not claimed.
        awaiting._asyncio_future_blocking = False
    return asyncio.get_running_loop().create_task(_resume(coro, awaiting, bool(blocking)))


class _Resumed:
    """What a coroutine suspended on its first step awaits, awaited for it by the task this
    runs in, and the coroutine continued with the outcome (a cancellation is thrown in)."""

    __slots__ = ("_awaiting", "_blocking", "_coro")

    def __init__(self, coro: Coroutine[Any, Any, None], awaiting: Any, blocking: bool) -> None:
        self._coro = coro
        self._awaiting = awaiting
        self._blocking = blocking

    def __await__(self) -> Generator[Any, Any, None]:
        coro, awaiting = self._coro, self._awaiting
        if self._blocking:
            awaiting._asyncio_future_blocking = True
        while True:
            try:
                value = yield awaiting
            except BaseException as exc:
                try:
                    awaiting = coro.throw(exc)
                except StopIteration:
                    return
                continue
            try:
                awaiting = coro.send(value)
            except StopIteration:
                return


async def _resume(coro: Coroutine[Any, Any, None], awaiting: Any, blocking: bool) -> None:
    await _Resumed(coro, awaiting, blocking)


def _ignore_result(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()

"""The produce path: one WebSocket per producer and segment, entries staged as they arrive and
acknowledged in send order once the group commit covering them is durable (docs/protocol.md).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

from aiohttp import web

from scalable_topics.core import wire

from .connection import (
    Closing,
    Connection,
    ConnectionHost,
    corrupted_error,
    not_writable_error,
    protocol_error,
)
from .storage.segment import (
    SegmentCorruptedError,
    SegmentGoneError,
    SegmentNotWritableError,
    SegmentReleasingError,
    SegmentSealedError,
)


class ProducerConnection(Connection):
    """Pipelined produce: entries are staged as they arrive; acks go out in send order once
    the group commit covering them completes."""

    role = "producer"

    def __init__(
        self, broker: ConnectionHost, ws: web.WebSocketResponse, request: web.Request
    ) -> None:
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
            raise corrupted_error(seg.corruption)
        if seg.writable or seg.sealed:
            return
        try:
            async with asyncio.timeout(self.broker.config.fence_wait_s):
                await seg.writable_event.wait()
        except TimeoutError:
            self.metrics.fenced_handshakes.labels("refused").inc()
            raise not_writable_error() from None
        self.metrics.fenced_handshakes.labels("opened").inc()

    def _start(self, hello: dict[str, Any]) -> None:
        assert self.hosted is not None
        name = hello.get("producerName")
        if not isinstance(name, str) or not 0 < len(name.encode()) <= wire.MAX_PRODUCER_NAME:
            raise protocol_error("bad_hello", "HELLO needs a producerName of 1..255 bytes")
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
            raise protocol_error(kind, f"unexpected frame type {data[0] if data else None}")
        if self.refused:
            return
        assert self.hosted is not None
        started = time.perf_counter()
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
                raise not_writable_error() from None
            except SegmentCorruptedError:
                # Like a seal: what was staged before is acknowledged, then ERROR and close.
                self.refused = True
                self.out_event.set()
                return
            except SegmentGoneError:
                raise Closing(
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
        self.metrics.observe_stage("frame", time.perf_counter() - started)

    def _checked_entries(self, data: bytes) -> list[tuple[memoryview, wire.EntryHeader]]:
        """Every entry of a SEND frame with its header, validated before any is staged: a
        malformed entry or one naming another producer refuses the whole frame (and closes
        the connection), so nothing of it is stored and no other producer's de-duplication
        state (its last sequence id) can be touched by this connection."""
        checked: list[tuple[memoryview, wire.EntryHeader]] = []
        for entry in wire.decode_send(data):
            header = wire.decode_entry_header(entry)
            if header.producer_name != self.producer_name:
                raise protocol_error(
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
            self.metrics.observe_stage("ack", time.perf_counter() - seg.visible_at)
            self.inflight_bytes -= freed
            if self.inflight_bytes <= self.window:
                self.window_open.set()
        if self.refused and seg.seal is None and seg.corruption is not None:
            if not unacked and self._close is None:
                closing = corrupted_error(seg.corruption)
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
        if await self.hosted.segment.seal_settled():
            self.out_event.set()
            return
        # The seal failed (its marker could not be written): the segment stays open, and the
        # entries refused meanwhile were not stored. The producer reconnects and sends them
        # again; this connection would otherwise drop every later frame, unacknowledged.
        self.close_soon("GoingAway", "the seal failed; reconnect", wire.CLOSE_GOING_AWAY)

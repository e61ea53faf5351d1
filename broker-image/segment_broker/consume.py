"""The consume path: one WebSocket per consumer of a subscription on a segment, fed by the
subscription's :class:`.dispatch.Dispatcher` within the consumer's permits (docs/protocol.md).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from scalable_topics.core import wire
from scalable_topics.core.subscriptions import BrokerSubscriptionType

from .connection import (
    Closing,
    Connection,
    ConnectionHost,
    corrupted_error,
    not_writable_error,
    protocol_error,
)
from .dispatch import Consumer, Dispatcher, DispatchError
from .storage.log import Corruption
from .transfer import hold_incoming

MAX_DELIVER_ITEMS = 1024


class ConsumerConnection(Connection):
    """Push consumption of one subscription with permits."""

    role = "consumer"

    async def _admit(self) -> None:
        assert self.hosted is not None
        if not await hold_incoming(self.hosted, self.broker.config.fence_wait_s):
            raise not_writable_error()

    def __init__(
        self, broker: ConnectionHost, ws: web.WebSocketResponse, request: web.Request
    ) -> None:
        super().__init__(broker, ws, request)
        self.dispatcher: Dispatcher | None = None
        self.consumer: Consumer | None = None

    def _start(self, hello: dict[str, Any]) -> None:
        assert self.hosted is not None
        sub = self.request.match_info["subscription"]
        disp = self.hosted.dispatchers.get(sub)
        if disp is None:
            raise Closing(
                "subscription_not_found",
                wire.ERR_SUBSCRIPTION_NOT_FOUND,
                f"no subscription {sub!r} on this segment",
                wire.CLOSE_SUBSCRIPTION_NOT_FOUND,
            )
        name = hello.get("consumerName")
        if not isinstance(name, str) or not name:
            raise protocol_error("bad_hello", "HELLO needs a consumerName")
        buckets = hello.get("buckets")
        if buckets is not None and (
            not isinstance(buckets, list)
            or not all(isinstance(b, int) and not isinstance(b, bool) for b in buckets)
        ):
            raise protocol_error("bad_hello", "buckets must be a list of integers")
        permits = hello.get("permits", 0)
        if not isinstance(permits, int) or isinstance(permits, bool) or permits < 0:
            raise protocol_error("bad_hello", "permits must be a non-negative integer")
        if disp.type is BrokerSubscriptionType.EXCLUSIVE and self.version < 2:
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
            raise Closing("bad_hello", exc.code, str(exc), close) from None
        self.dispatcher = disp
        if permits:
            disp.flow(self.consumer, permits)

    def _stop(self) -> None:
        if self.dispatcher is not None and self.consumer is not None:
            self.dispatcher.detach(self.consumer)

    # ConsumerSink
    def deliver(self, items: list[tuple[int, int, Any]]) -> None:
        partial = self.dispatcher.cursor.partial if self.dispatcher is not None else None
        for i in range(0, len(items), MAX_DELIVER_ITEMS):
            chunk = items[i : i + MAX_DELIVER_ITEMS]
            if partial and self.version >= 4:
                acked = {pos: partial[pos] for pos, _, _ in chunk if pos in partial}
                if acked:
                    self.out.append(wire.encode_acked_indexes(acked))
            self.out.append(wire.encode_deliver(chunk))
        self.out_event.set()

    def end_of_segment(self, last_position: int) -> None:
        self.send(wire.encode_end_of_segment(last_position))

    def end_of_buckets(self, last_position: int) -> None:
        if self.version >= 2:
            self.send(wire.encode_end_of_buckets(last_position))

    def buckets_done(self, last_position: int, buckets: list[int]) -> None:
        if self.version >= 3:
            self.send(wire.encode_buckets_done(last_position, buckets))

    def corrupted(self, corruption: Corruption) -> None:
        closing = corrupted_error(corruption)
        self.close_soon(closing.code, str(closing), closing.close_code, closing.extra)

    def _on_frame(self, data: bytes) -> None:
        disp = self.dispatcher
        consumer = self.consumer
        assert disp is not None and consumer is not None
        kind = wire.frame_type(data)
        try:
            if kind == wire.FRAME_FLOW:
                disp.flow(consumer, wire.decode_flow(data))
            elif kind == wire.FRAME_ACK and wire.is_partial_ack(data):
                if self.version < 4:
                    raise protocol_error("bad_ack", "partial ACKs need protocol version 4")
                disp.ack_partial(consumer, wire.decode_partial_ack(data))
            elif kind == wire.FRAME_ACK:
                cumulative, positions = wire.decode_ack(data)
                disp.ack(consumer, positions, cumulative)
            elif kind == wire.FRAME_NACK:
                disp.nack(consumer, wire.decode_nack(data))
            else:
                raise protocol_error("unknown_frame", f"unexpected frame type {kind}")
        except DispatchError as exc:
            raise protocol_error("bad_ack", str(exc)) from None

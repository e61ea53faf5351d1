"""A consumer attach cancelled in the middle of its handshake, or a close cancelled in the
middle of closing, closes its WebSocket.

The SDK cancels a segment reader whenever a bucket or segment is handed over; if that lands
while ``SegmentConsumer.connect`` waits for the broker's ``HELLO_OK``, the half-open connection
must not be left behind: the broker would keep the consumer attached (holding its buckets, so
the new owner is refused) until its heartbeat gave up on the silent peer — 45 s, the stall the
key-shared chaos run showed after a rollover (docs/correctness.md). A peer that never answers
the ``HELLO`` stands in for a broker that has not answered yet.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
from aiohttp import web

from scalable_topics.client.segment import SegmentAdmin, SegmentConsumer, SegmentError
from scalable_topics.core import wire
from scalable_topics.credentials import client_session
from segment_broker.testing import running_broker


async def test_a_cancelled_attach_closes_its_connection() -> None:
    hello = asyncio.Event()
    closed = asyncio.Event()

    async def consume(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            if message.type is aiohttp.WSMsgType.BINARY:
                hello.set()  # and never answer it
        closed.set()
        return ws

    app = web.Application()
    app.router.add_get("/ws/v1/consume/{tail:.*}", consume)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    session = client_session()
    try:
        attach = asyncio.create_task(
            SegmentConsumer.connect(
                f"http://127.0.0.1:{port}", "ns", "t", 0, "sub", "c1", session=session
            )
        )
        await asyncio.wait_for(hello.wait(), 10)
        attach.cancel()
        await asyncio.gather(attach, return_exceptions=True)
        await asyncio.wait_for(closed.wait(), 5)
    finally:
        await session.close()
        await runner.cleanup()


async def test_a_cancelled_close_still_lets_go_of_the_subscription(tmp_path: Path) -> None:
    """The SDK closes a segment consumer while handing it over, and the task doing so can be
    cancelled meanwhile (the reader stopped twice, the consumer closing). The connection must
    close anyway: left open, its read loop keeps answering the broker's heartbeats and the
    broker keeps the consumer attached, refusing the next owner (``ConsumerBusy``) for as long
    as the process lives."""
    async with running_broker(tmp_path) as rb, SegmentAdmin(rb.url) as admin:
        await admin.create_segment("ns", "t", 0, 0, 0xFFFF, subscriptions={"s": "Stream"})
        first = await SegmentConsumer.connect(rb.url, "ns", "t", 0, "s", "first")
        closing = asyncio.create_task(first.close())
        await asyncio.sleep(0)  # let the close start, then cancel it where it waits
        closing.cancel()
        await asyncio.gather(closing, return_exceptions=True)

        async with asyncio.timeout(10):
            while True:
                try:
                    second = await SegmentConsumer.connect(rb.url, "ns", "t", 0, "s", "second")
                    break
                except SegmentError as exc:
                    assert exc.code == wire.ERR_CONSUMER_BUSY, exc
                    await asyncio.sleep(0.05)
        await second.close()

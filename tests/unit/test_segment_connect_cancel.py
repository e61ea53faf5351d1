"""A consumer attach cancelled in the middle of its handshake closes its WebSocket.

The SDK cancels a segment reader whenever a bucket or segment is handed over; if that lands
while ``SegmentConsumer.connect`` waits for the broker's ``HELLO_OK``, the half-open connection
must not be left behind: the broker would keep the consumer attached (holding its buckets, so
the new owner is refused) until its heartbeat gave up on the silent peer — 45 s, the stall the
key-shared chaos run showed after a rollover (docs/correctness.md). A peer that never answers
the ``HELLO`` stands in for a broker that has not answered yet.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from scalable_topics.client.segment import SegmentConsumer
from scalable_topics.credentials import client_session


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

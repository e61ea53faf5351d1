"""``send_now``: the SDK writes a frame into the socket as it is sent, in order, and a frame
that has to wait for a full socket to drain finishes in a task (a real WebSocket pair on
loopback, the peer at first not reading)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from scalable_topics.client.segment import send_now

FRAME = 256 * 1024


@pytest.fixture
async def peer() -> AsyncIterator[tuple[str, asyncio.Event, list[bytes]]]:
    """A WebSocket server that reads only once ``reading`` is set, recording the frames."""
    reading = asyncio.Event()
    received: list[bytes] = []

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        await reading.wait()
        async for message in ws:
            if message.type is aiohttp.WSMsgType.BINARY:
                received.append(message.data)
        return ws

    app = web.Application()
    app.router.add_get("/ws", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/ws", reading, received
    finally:
        await runner.cleanup()


async def test_frames_are_written_at_once_and_in_order_even_past_a_full_socket(
    peer: tuple[str, asyncio.Event, list[bytes]],
) -> None:
    url, reading, received = peer
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        assert send_now(ws, b"first") is None, "an uncompressed frame needs no task"

        frames = [bytes([i % 251]) * FRAME for i in range(200)]
        tasks = [send_now(ws, frame) for frame in frames]
        waiting = [t for t in tasks if t is not None]
        assert waiting, "the peer does not read: some sends wait for the drain"
        assert not all(t.done() for t in waiting)

        reading.set()
        async with asyncio.timeout(30):
            await asyncio.gather(*waiting)
            while len(received) < 1 + len(frames):  # noqa: ASYNC110 - frames arrive on the peer
                await asyncio.sleep(0.01)
        assert received == [b"first", *frames]

        await ws.close()
        with pytest.raises(aiohttp.ClientConnectionResetError):
            send_now(ws, b"after the close")

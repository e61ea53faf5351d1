"""The broker's aiohttp application: its lifecycle, the routes it serves, the admin auth check,
health and metrics. The admin API is :mod:`.admin` (ownership transfer: :mod:`.transfer`), the
WebSocket produce and consume paths :mod:`.produce` and :mod:`.consume` on the plumbing of
:mod:`.connection`; the segments themselves are :mod:`.store` and :mod:`.storage`.

Wire protocol: docs/protocol.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from scalable_topics.core import wire

from .admin import AdminRoutes
from .config import BrokerConfig
from .connection import CLOSE_TIMEOUT, Connection
from .consume import ConsumerConnection
from .corruption import CorruptionReporter
from .load import LoadTracker
from .metrics import BrokerMetrics
from .pauses import PauseMonitor
from .produce import ProducerConnection
from .routes import json_error
from .storage.segment import StorageSettings
from .store import SegmentStore
from .transfer import TransferRoutes

__all__ = ["Broker", "ConsumerConnection", "ProducerConnection", "TokenAuth", "json_error"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
        self.pauses = PauseMonitor(
            self.metrics.event_loop_lag_seconds, self.metrics.gc_pause_seconds
        )
        self.tracker = tracker
        self.store = SegmentStore(
            Path(config.data_dir),
            StorageSettings(
                fsync=config.fsync,
                fsync_interval_ms=config.fsync_interval_ms,
                roll_bytes=config.roll_bytes,
                cache_bytes=config.cache_bytes,
                cursor_flush_ms=config.cursor_flush_ms,
                page_cache_bytes=config.page_cache_bytes,
            ),
            self.metrics,
            tracker,
            corruption_reporter,
        )
        self.metrics.watch_segments(lambda: self.store)
        self.auth = TokenAuth(Path(config.admin_token_file)) if config.admin_token_file else None
        self.ready = False
        self.stopping = False
        self.connections: set[Connection] = set()

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        await self.store.open()
        self.pauses.start()
        self.ready = True

    async def stop(self) -> None:
        self.ready = False
        self.stopping = True
        for conn in list(self.connections):
            conn.close_soon("GoingAway", "broker shutting down", wire.CLOSE_GOING_AWAY)
        waits = [conn.done.wait() for conn in list(self.connections)]
        if waits:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await asyncio.gather(*waits)
        await self.store.close()
        await self.pauses.stop()

    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth_middleware], client_max_size=1 << 20)
        r = app.router
        r.add_get("/healthz", self.healthz)
        r.add_get("/readyz", self.readyz)
        r.add_get("/metrics", self.metrics_handler)
        base = "/admin/v1/segments"
        seg = base + "/{namespace}/{topic}/{segment_id}"
        AdminRoutes(self.store).register(app, base, seg)
        r.add_get("/ws/v1/produce/{namespace}/{topic}/{segment_id}", self.produce)
        r.add_get("/ws/v1/consume/{namespace}/{topic}/{segment_id}/{subscription}", self.consume)
        TransferRoutes(self.store).register(app, seg)
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
                        for h in self.store.quarantined.values()
                        if h.segment.corruption is not None
                    },
                }
            )
        return web.json_response({"status": "not ready"}, status=503)

    async def metrics_handler(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

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

"""Who may use this broker (``--auth kubernetes``; docs/security.md).

* ``/ws/v1/produce/{ns}/{topic}/…``: verb ``produce`` on the topic; ``/ws/v1/consume/…``:
  ``consume``. Checked once, at the handshake: the connection keeps the decision.
* ``/admin/…``: only the identities of ``--admin-identities`` (the operator's ServiceAccount),
  except ``GET`` of one segment's stats, also allowed to whoever may ``consume`` the topic
  (a checkpoint consumer reads a sealed segment's last position there).
* ``/healthz``, ``/readyz``, ``/metrics``: open (probes; metrics are fenced by NetworkPolicy).

A refused WebSocket is accepted and gets an ``ERROR`` frame (``Unauthenticated``,
``Forbidden`` or ``AuthUnavailable``, the message naming the missing permission) then a close
(4401, 4403, 1013); a refused HTTP request gets the JSON error body with 401, 403 or 503.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web

from scalable_topics.core import wire
from scalable_topics.core.auth import (
    VERB_CONSUME,
    VERB_PRODUCE,
    AccessDenied,
    Identity,
    admin_forbidden,
)
from scalable_topics.kubeauth import KubernetesAuth

from .metrics import BrokerMetrics

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
STATS_ROUTE = "/admin/v1/segments/{namespace}/{topic}/{segment_id}"
"""The one admin route a consumer may use (a sealed segment's last position)."""


def _route(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else ""


class BrokerAccess:
    def __init__(
        self,
        auth: KubernetesAuth,
        admin_identities: frozenset[str],
        metrics: BrokerMetrics | None = None,
    ) -> None:
        self.auth = auth
        self.admin_identities = admin_identities
        self.metrics = metrics

    def protect(self, app: web.Application) -> None:
        """Check every request of ``app`` (the broker's) before its own middlewares."""
        app.middlewares.insert(0, self.middleware)

    async def check(self, request: web.Request) -> Identity | None:
        """The caller's identity when allowed (None for open paths); :class:`AccessDenied`."""
        path = request.path
        if path in OPEN_PATHS:
            return None
        info = request.match_info
        identity = await self.auth.authenticate(request.headers.get(hdrs.AUTHORIZATION))
        if path.startswith("/ws/v1/produce/"):
            await self.auth.authorize(identity, VERB_PRODUCE, info["namespace"], info["topic"])
        elif path.startswith("/ws/v1/consume/"):
            await self.auth.authorize(identity, VERB_CONSUME, info["namespace"], info["topic"])
        elif identity.username not in self.admin_identities:
            namespace, topic = info.get("namespace", ""), info.get("topic", "")
            one_segment = request.method == "GET" and _route(request) == STATS_ROUTE
            if not (
                one_segment and await self.auth.allowed(identity, VERB_CONSUME, namespace, topic)
            ):
                raise admin_forbidden(identity, self.admin_identities)
        return identity

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            await self.check(request)
        except AccessDenied as exc:
            if self.metrics is not None:
                self.metrics.auth_refusals.labels(exc.code).inc()
            if request.path.startswith("/ws/"):
                return await _refuse_websocket(request, exc)
            return web.json_response(
                {"error": {"code": exc.code, "message": str(exc)}}, status=exc.status
            )
        return await handler(request)


async def _refuse_websocket(request: web.Request, exc: AccessDenied) -> web.StreamResponse:
    """Upgrade, send the ERROR frame and close: a client sees why, not a bare HTTP status."""
    ws = web.WebSocketResponse(timeout=2.0)
    await ws.prepare(request)
    with contextlib.suppress(Exception):
        await ws.send_bytes(wire.encode_error(exc.code, str(exc)))
        await ws.close(
            code=exc.close_code, message=str(exc).encode()[:120].decode(errors="ignore").encode()
        )
    return ws

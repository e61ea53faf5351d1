"""Who may use the operator's sessions (``--auth kubernetes``; docs/security.md).

* ``/v1/topics/{ns}/{name}/dag``: verb ``get`` on the topic (the DAG is in the topic's
  ``status``: whoever may read the topic may watch it; the example producer and consumer
  ClusterRoles grant it).
* ``/v1/topics/{ns}/{name}/consumers``: verb ``consume``.
* ``/metrics``, ``/healthz``, ``/readyz``: open (probes; metrics are fenced by NetworkPolicy).

Checked once per request (a WebSocket session's handshake), before the leader redirect. A
refused WebSocket is accepted and gets an ``error`` message (code ``Unauthenticated``,
``Forbidden`` or ``AuthUnavailable``, the text naming the missing permission) and a close
(4401, 4403, 1013); a plain HTTP request gets ``{"error", "message"}`` with 401, 403 or 503.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web

from ..core.auth import VERB_CONSUME, VERB_GET, AccessDenied
from ..core.sessions import CloseCode, ErrorCode, ErrorMessage, encode
from ..kubeauth import KubernetesAuth
from . import metrics

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_VERBS = {"dag": VERB_GET, "consumers": VERB_CONSUME}


class SessionAccess:
    def __init__(self, auth: KubernetesAuth) -> None:
        self.auth = auth

    def protect(self, app: web.Application) -> None:
        """Check every request of ``app`` (``sessions.make_app``) first."""
        app.middlewares.insert(0, self.middleware)

    async def check(self, request: web.Request) -> None:
        parts = request.path.strip("/").split("/")
        if len(parts) != 5 or parts[:2] != ["v1", "topics"] or parts[4] not in _VERBS:
            return
        identity = await self.auth.authenticate(request.headers.get(hdrs.AUTHORIZATION))
        await self.auth.authorize(identity, _VERBS[parts[4]], parts[2], parts[3])

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            await self.check(request)
        except AccessDenied as exc:
            metrics.AUTH_REFUSALS.labels(exc.code).inc()
            if request.headers.get(hdrs.UPGRADE, "").lower() == "websocket":
                return await _refuse_websocket(request, exc)
            return web.json_response({"error": exc.code, "message": str(exc)}, status=exc.status)
        return await handler(request)


async def _refuse_websocket(request: web.Request, exc: AccessDenied) -> web.StreamResponse:
    ws = web.WebSocketResponse(timeout=2.0)
    await ws.prepare(request)
    with contextlib.suppress(Exception):
        await ws.send_str(encode(ErrorMessage(code=ErrorCode(exc.code), message=str(exc))))
        await ws.close(
            code=CloseCode[ErrorCode(exc.code).name],
            message=str(exc).encode()[:120].decode(errors="ignore").encode(),
        )
    return ws

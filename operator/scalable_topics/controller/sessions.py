"""The operator's HTTP/WebSocket server (DESIGN §6; wire format in ``core.sessions``).

Routes (aiohttp, port 8080):

* ``GET /v1/topics/{namespace}/{name}/dag`` - DAG watch session, served by every replica from
  its topic cache: the full DAG on connect, then one message per change. Without a WebSocket
  upgrade it returns the current DAG as JSON (``stopic dag``, curl).
* ``GET /v1/topics/{namespace}/{name}/consumers`` - consumer controller session (stream,
  checkpoint and queue consumers), served only by the leader of the topic's shard (others
  answer ``307`` to the leader, or ``503`` with ``Retry-After`` while no leader is known). The
  consumer side lives in :mod:`.consumers`.
* ``/metrics`` (Prometheus), ``/healthz``, ``/readyz``.

Nothing a client sends can crash the server: a malformed message gets an ``error`` message and
that socket is closed; every other session carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable
from typing import Any

from aiohttp import WSMsgType, hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from ..core.sessions import (
    MAX_MESSAGE_BYTES,
    CloseCode,
    DagMessage,
    DrainedMessage,
    ErrorCode,
    ErrorMessage,
    PositionMessage,
    RegisterMessage,
    ReleasedMessage,
    SessionProtocolError,
    UnregisterMessage,
    encode,
    parse_client_message,
)
from . import metrics
from .consumers import (
    ConsumerConnection,
    ConsumerHub,
    SessionRejected,
    close_reason,
    leader_elsewhere,
)
from .interfaces import DagSource, Routing

__all__ = ["make_app"]

log = logging.getLogger("scalable_topics.controller.sessions")

DEFAULT_HEARTBEAT = 20.0
"""Seconds between WebSocket pings; a peer that misses the pong for half of it is dropped."""
DEFAULT_REGISTER_TIMEOUT = 30.0
"""Seconds a consumer socket may stay open without sending ``register``."""
RETRY_AFTER = 1


def _error_json(status: int, code: ErrorCode | str, message: str, **headers: str) -> web.Response:
    return web.json_response(
        {"error": str(code), "message": message}, status=status, headers=headers or None
    )


def _is_websocket(request: web.Request) -> bool:
    return (
        request.headers.get(hdrs.UPGRADE, "").lower() == "websocket"
        and "upgrade" in request.headers.get(hdrs.CONNECTION, "").lower()
    )


async def _send_and_close(
    ws: web.WebSocketResponse, message: BaseModel | None, code: int, reason: str
) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        if message is not None and not ws.closed:
            await ws.send_str(encode(message))
        await ws.close(code=code, message=close_reason(reason))


def make_app(
    dags: DagSource,
    routing: Routing,
    hub: ConsumerHub,
    *,
    health: Callable[[], bool],
    ready: Callable[[], bool],
    liveness: Callable[[], list[dict[str, Any]]] | None = None,
    heartbeat: float = DEFAULT_HEARTBEAT,
    register_timeout: float = DEFAULT_REGISTER_TIMEOUT,
    own_url: str | None = None,
) -> web.Application:
    """The operator's aiohttp application. Binds ``dags`` and ``routing`` to ``hub`` (for broker
    URLs and redirects); on shutdown closes the DAG watchers and the hub.

    ``own_url`` is this replica's advertised URL (default: ``routing.url`` when the routing has
    one, as ``ShardLeadership`` does); a leader URL equal to it is stale and never redirected to.

    ``/healthz`` answers 503 once ``health()`` is false (stopping) and 500 with a JSON body
    listing the failed checks while ``liveness()`` returns any (see ``controller.health``).
    """
    if own_url is None:
        candidate = getattr(routing, "url", "")
        own_url = candidate if isinstance(candidate, str) else ""
    own = own_url.rstrip("/")
    hub.bind(dags=dags, routing=routing, own_url=own)
    app = web.Application()
    watchers: weakref.WeakSet[web.WebSocketResponse] = weakref.WeakSet()

    async def dag_session(request: web.Request) -> web.StreamResponse:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if not ready() and dags.dag(namespace, name) is None:
            # Not found is final for a client; before its first sync this replica cannot know.
            return _error_json(
                503,
                "NotReady",
                f"this controller replica is still reading the cluster; retry {namespace}/{name}",
                **{hdrs.RETRY_AFTER: str(RETRY_AFTER)},
            )
        if not _is_websocket(request):
            dag = dags.dag(namespace, name)
            if dag is None:
                return _error_json(
                    404, ErrorCode.UNKNOWN_TOPIC, f"topic {namespace}/{name} not found"
                )
            return web.Response(text=encode(dag), content_type="application/json")
        ws = web.WebSocketResponse(heartbeat=heartbeat, max_msg_size=MAX_MESSAGE_BYTES)
        await ws.prepare(request)
        metrics.SESSIONS.labels("dag").inc()
        watchers.add(ws)
        try:
            await _serve_dag(ws, dags, namespace, name)
        finally:
            metrics.SESSIONS.labels("dag").dec()
        return ws

    async def consumer_session(request: web.Request) -> web.StreamResponse:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if not routing.leads(namespace, name):
            leader = leader_elsewhere(routing, own, namespace, name)
            if leader:
                location = leader + request.path_qs
                log.debug("consumer session for %s/%s: redirect to %s", namespace, name, location)
                raise web.HTTPTemporaryRedirect(location=location)
            return _error_json(
                503,
                "NoLeader",
                f"no controller leads topic {namespace}/{name} right now; retry",
                **{hdrs.RETRY_AFTER: str(RETRY_AFTER)},
            )
        if not _is_websocket(request):
            return _error_json(
                426,
                ErrorCode.BAD_MESSAGE,
                "the consumer controller session is a WebSocket",
                **{hdrs.UPGRADE: "websocket"},
            )
        if dags.dag(namespace, name) is not None and not hub.serves(namespace, name):
            return _error_json(
                503,
                "NotReady",
                f"the controller is taking topic {namespace}/{name} over; retry",
                **{hdrs.RETRY_AFTER: str(RETRY_AFTER)},
            )
        ws = web.WebSocketResponse(heartbeat=heartbeat, max_msg_size=MAX_MESSAGE_BYTES)
        await ws.prepare(request)
        metrics.SESSIONS.labels("consumer").inc()
        try:
            await _serve_consumer(ws, dags, hub, namespace, name, register_timeout)
        finally:
            metrics.SESSIONS.labels("consumer").dec()
        return ws

    async def metrics_handler(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(request: web.Request) -> web.Response:
        if not health():
            return web.Response(status=503, text="down\n")
        failed = liveness() if liveness is not None else []
        if failed:
            return web.json_response({"healthy": False, "failed": failed}, status=500)
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        if ready():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="not ready\n")

    async def shutdown(app: web.Application) -> None:
        await asyncio.gather(
            *(
                _send_and_close(ws, None, CloseCode.GOING_AWAY, "controller shutting down")
                for ws in list(watchers)
            ),
            return_exceptions=True,
        )
        await hub.close()

    app.router.add_get("/v1/topics/{namespace}/{name}/dag", dag_session)
    app.router.add_get("/v1/topics/{namespace}/{name}/consumers", consumer_session)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.on_shutdown.append(shutdown)
    return app


async def _close_unknown_topic(
    ws: web.WebSocketResponse, namespace: str, name: str, *, deleted: bool = False
) -> None:
    what = "was deleted" if deleted else "not found"
    await _send_and_close(
        ws,
        ErrorMessage(code=ErrorCode.UNKNOWN_TOPIC, message=f"topic {namespace}/{name} {what}"),
        CloseCode.UNKNOWN_TOPIC,
        "topic deleted" if deleted else "unknown topic",
    )


# -- DAG watch --------------------------------------------------------------------------------


async def _serve_dag(ws: web.WebSocketResponse, dags: DagSource, namespace: str, name: str) -> None:
    dag = dags.dag(namespace, name)
    if dag is None:
        await _close_unknown_topic(ws, namespace, name)
        return
    log.debug("DAG watch of %s/%s opened", namespace, name)
    reader = asyncio.create_task(_ignore_incoming(ws))
    pusher = asyncio.create_task(_push_dags(ws, dags, namespace, name, dag))
    try:
        done, _ = await asyncio.wait({reader, pusher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (reader, pusher):
            task.cancel()
        await asyncio.gather(reader, pusher, return_exceptions=True)
    if pusher in done and not pusher.cancelled() and pusher.exception() is None:
        await _close_unknown_topic(ws, namespace, name, deleted=True)
    elif pusher in done and not pusher.cancelled() and pusher.exception() is not None:
        log.error("DAG watch of %s/%s failed", namespace, name, exc_info=pusher.exception())
        await _send_and_close(ws, None, CloseCode.GOING_AWAY, "DAG watch failed")
    log.debug("DAG watch of %s/%s closed", namespace, name)


async def _ignore_incoming(ws: web.WebSocketResponse) -> None:
    """Read until the client goes away (it sends nothing; pings are answered by aiohttp)."""
    async for _ in ws:
        pass


async def _push_dags(
    ws: web.WebSocketResponse, dags: DagSource, namespace: str, name: str, first: DagMessage
) -> None:
    await ws.send_str(encode(first))
    last = first
    updates = dags.watch(namespace, name)
    try:
        async for dag in updates:
            if dag != last:
                await ws.send_str(encode(dag))
                last = dag
    finally:
        close = getattr(updates, "aclose", None)
        if close is not None:
            await close()


# -- consumer controller session --------------------------------------------------------------


def _protocol_error(text: str) -> ErrorMessage:
    return ErrorMessage(code=ErrorCode.BAD_MESSAGE, message=text)


async def _serve_consumer(
    ws: web.WebSocketResponse,
    dags: DagSource,
    hub: ConsumerHub,
    namespace: str,
    name: str,
    register_timeout: float,
) -> None:
    if dags.dag(namespace, name) is None:
        await _close_unknown_topic(ws, namespace, name)
        return
    try:
        first = await ws.receive(timeout=register_timeout)
    except TimeoutError:
        await _send_and_close(
            ws,
            _protocol_error(f"expected a register message within {register_timeout:g}s"),
            CloseCode.BAD_MESSAGE,
            "no register",
        )
        return
    if first.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
        return
    try:
        if first.type is not WSMsgType.TEXT:
            raise SessionProtocolError("messages are JSON text frames")
        message = parse_client_message(first.data)
        if not isinstance(message, RegisterMessage):
            raise SessionProtocolError(
                f"the first message must be 'register', got {message.type!r}"
            )
        session = hub.open_session(namespace, name, message, ws)
    except (SessionProtocolError, SessionRejected) as exc:
        log.info(
            "consumer session for %s/%s refused: %s",
            namespace,
            name,
            exc,
            extra={"event": "consumer.refused", "topic": f"{namespace}/{name}"},
        )
        if isinstance(exc, SessionRejected):
            await _send_and_close(ws, exc.message, exc.code, str(exc))
        else:
            await _send_and_close(ws, _protocol_error(str(exc)), CloseCode.BAD_MESSAGE, str(exc))
        return
    try:
        await _consume_messages(ws, hub, session)
    finally:
        hub.session_closed(session)
        await session.wait_closed()


async def _consume_messages(
    ws: web.WebSocketResponse, hub: ConsumerHub, session: ConsumerConnection
) -> None:
    async for frame in ws:
        if session.finishing:
            return
        if frame.type is WSMsgType.ERROR:
            log.info("%r: socket error: %s", session, ws.exception())
            return
        try:
            if frame.type is not WSMsgType.TEXT:
                raise SessionProtocolError("messages are JSON text frames")
            message = parse_client_message(frame.data)
        except SessionProtocolError as exc:
            log.info(
                "%r: malformed message: %s",
                session,
                exc,
                extra={
                    "event": "consumer.bad_message",
                    "topic": f"{session.namespace}/{session.topic}",
                    "subscription": session.subscription,
                    "consumer": session.consumer,
                },
            )
            session.finish(_protocol_error(str(exc)), CloseCode.BAD_MESSAGE, str(exc))
            return
        if isinstance(message, DrainedMessage):
            hub.report_drained(session, message.segment, message.buckets)
        elif isinstance(message, PositionMessage):
            hub.record_position(session, message.segment, message.position)
        elif isinstance(message, ReleasedMessage):
            hub.report_released(session, message.segment, message.buckets)
        elif isinstance(message, UnregisterMessage):
            hub.unregister(session)
            return
        else:
            text = "already registered: one registration per session"
            session.finish(_protocol_error(text), CloseCode.BAD_MESSAGE, text)
            return

"""One consumer WebSocket of the session server (:class:`ConsumerConnection`, one writer task
per socket) and the session layer's refusals and redirects."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from ...core.sessions import (
    AssignmentMessage,
    CloseCode,
    ConsumerType,
    ErrorMessage,
    RedirectMessage,
    encode,
)
from ..interfaces import Routing

log = logging.getLogger("scalable_topics.controller.sessions")

PersistFn = Callable[[str, str, str, dict[str, Any]], Awaitable[None]]
ConsumersChangedFn = Callable[[str, str], None]

_PERSIST_BACKOFF = (0.5, 30.0)
_RETRY_AFTER = 1.0
"""Seconds a client should wait before reconnecting when no new leader is known yet."""
_CLOSE_FLUSH_TIMEOUT = 5.0


class SessionRejected(Exception):
    """A registration the hub refuses; the session layer sends ``message`` and closes."""

    def __init__(self, code: CloseCode, message: ErrorMessage | RedirectMessage) -> None:
        super().__init__(message.message if isinstance(message, ErrorMessage) else message.reason)
        self.code = code
        self.message = message


def leader_elsewhere(routing: Routing, own_url: str, namespace: str, topic: str) -> str:
    """The base URL of the topic's leader when it is another replica, else "".

    Right after losing a shard the Lease still names this replica until another one takes it;
    pointing a client back here would only bounce it, so that counts as "unknown".
    """
    if routing.leads(namespace, topic):
        return ""
    leader = routing.leader_url(namespace, topic).rstrip("/")
    return "" if not leader or leader == own_url else leader


def close_reason(text: str) -> bytes:
    """A WebSocket close reason: at most 123 bytes of UTF-8."""
    data = text.encode()
    return data if len(data) <= 123 else data[:120].decode(errors="ignore").encode() + b"..."


_session_ids = itertools.count(1)


class ConsumerConnection:
    """One consumer socket after a successful ``register``.

    Outgoing messages go through a small outbox drained by one writer task: assignments are full
    states, so a pending assignment not yet written is replaced by a newer one; other messages
    are kept in order. :meth:`finish` queues a last message and closes the socket.
    """

    def __init__(
        self,
        ws: web.WebSocketResponse,
        *,
        namespace: str,
        topic: str,
        subscription: str,
        consumer: str,
        consumer_type: ConsumerType,
    ) -> None:
        self.id = next(_session_ids)
        self.ws = ws
        self.namespace = namespace
        self.topic = topic
        self.subscription = subscription
        self.consumer = consumer
        self.consumer_type = consumer_type
        self.sent_brokers: dict[int, str | None] = {}
        """Broker URL of every segment in the last assignment queued for this socket."""
        self._outbox: deque[BaseModel] = deque()
        self._final: tuple[BaseModel | None, int, str] | None = None
        self._wake = asyncio.Event()
        self._writer = asyncio.create_task(self._write_loop(), name=f"consumer-session-{self.id}")

    def __repr__(self) -> str:
        return (
            f"<ConsumerConnection {self.id} {self.namespace}/{self.topic} "
            f"{self.subscription}/{self.consumer}>"
        )

    @property
    def finishing(self) -> bool:
        return self._final is not None

    def send(self, message: BaseModel) -> None:
        if self._final is not None:
            return
        if isinstance(message, AssignmentMessage):
            for queued in [m for m in self._outbox if isinstance(m, AssignmentMessage)]:
                self._outbox.remove(queued)
        self._outbox.append(message)
        self._wake.set()

    def finish(self, message: BaseModel | None, code: int, reason: str) -> None:
        """Send ``message`` (if any) after what is queued, then close with ``code``."""
        if self._final is None:
            self._final = (message, code, reason)
            self._wake.set()

    async def wait_closed(self) -> None:
        """Wait until the last message is written and the socket closed (the handler calls
        this; cancelling the caller does not cut the writer's close short)."""
        try:
            await asyncio.shield(self._writer)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            # the writer itself was cancelled (shutdown ran out of time): nothing to wait for

    @property
    def writer(self) -> asyncio.Task[None]:
        return self._writer

    async def _write_loop(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._outbox:
                    await self.ws.send_str(encode(self._outbox.popleft()))
                if self._final is not None:
                    message, _, _ = self._final
                    if message is not None and not self.ws.closed:
                        await self.ws.send_str(encode(message))
                    break
        except (ConnectionError, RuntimeError) as exc:
            log.debug("%r: write failed: %s", self, exc)
        if self._final is None:
            self._final = (None, CloseCode.GOING_AWAY, "writer stopped")
        _, code, reason = self._final
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.ws.close(code=code, message=close_reason(reason))

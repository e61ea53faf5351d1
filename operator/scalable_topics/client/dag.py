"""DAG watch session client (DESIGN §6, ``core.sessions``): keeps a topic's latest DAG.

The operator pushes the whole DAG on connect and on every change (latest wins). A
:class:`DagWatcher` holds the newest message, reconnects with backoff when the session drops
(any replica serves DAG watches; redirects are followed), and never goes backwards: a message
with a lower epoch than the one held is ignored, so a reconnect to a replica whose cache lags
cannot undo what the client already knows.

It is also how the producer and the consumers learn that their topic was deleted: the replica
serving the watch closes it with ``UnknownTopic`` the moment its cache drops the topic, and the
watcher gives up with :class:`TopicNotFoundError` (see :class:`DagWatcher` for the bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import aiohttp

from scalable_topics.core.backoff import Backoff
from scalable_topics.core.sessions import (
    CloseCode,
    DagMessage,
    ErrorCode,
    ErrorMessage,
    SessionProtocolError,
    dag_path,
    parse_server_message,
)
from scalable_topics.credentials import client_session

from .segment import WS_TIMEOUT, AccessDeniedError, ws_connect

__all__ = ["TOPIC_GONE_AFTER", "Backoff", "DagWatcher", "TopicNotFoundError", "http_url", "ws_url"]

log = logging.getLogger("scalable_topics.client.dag")


TOPIC_GONE_AFTER = 10.0
"""Seconds a topic the watcher had must stay unknown across reconnects before the watcher gives
up on it (a replica that never had the topic may only be lagging; one that drops it while
serving the watch saw it deleted, and that ends the watch at once)."""


_DENIED = (ErrorCode.UNAUTHENTICATED, ErrorCode.FORBIDDEN)


class TopicNotFoundError(Exception):
    """The topic does not exist, or was deleted while in use (``deleted``).

    The one error for it across the SDK: :meth:`DagWatcher.start` and the clients' ``start``
    raise it for an unknown topic; once a topic in use is deleted, the producer's sends and the
    consumers' ``receive`` raise it (a consumer's is a ``ConsumerError`` as well), with the
    operator's message, e.g. ``topic default/orders was deleted``.
    """

    code = "UnknownTopic"

    def __init__(self, message: str, *, deleted: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.deleted = deleted


def ws_url(url: str) -> str:
    url = url.rstrip("/")
    if url.startswith("http://"):
        return "ws://" + url[len("http://") :]
    if url.startswith("https://"):
        return "wss://" + url[len("https://") :]
    return url


def http_url(url: str) -> str:
    url = url.rstrip("/")
    if url.startswith("ws://"):
        return "http://" + url[len("ws://") :]
    if url.startswith("wss://"):
        return "https://" + url[len("wss://") :]
    return url


Listener = Callable[[DagMessage], None]
FailureListener = Callable[[TopicNotFoundError], None]


class DagWatcher:
    """Follows one topic's DAG watch session.

    ``await watcher.start()`` returns once the first DAG is known (or raises
    :class:`TopicNotFoundError`); afterwards :attr:`dag` is always the newest DAG and
    listeners added with :meth:`add_listener` are called (synchronously, on the event loop)
    with every newer one.

    A topic deleted after that ends the watcher: :attr:`failure` becomes a
    :class:`TopicNotFoundError` (``deleted=True``), the listeners added with
    :meth:`add_failure_listener` are called with it once, and :meth:`wait_for` raises it. That
    happens as soon as the replica serving the watch drops the topic (it closes the session with
    ``UnknownTopic`` after having served it), or, when the session was down at that moment, once
    the topic has been unknown on every reconnect for ``gone_after`` seconds
    (:data:`TOPIC_GONE_AFTER`).
    """

    def __init__(
        self,
        service_url: str,
        namespace: str,
        topic: str,
        *,
        session: aiohttp.ClientSession | None = None,
        heartbeat: float = 20.0,
        gone_after: float = TOPIC_GONE_AFTER,
        ca_file: str | None = None,
    ) -> None:
        self.service_url = http_url(service_url)
        self._ca_file = ca_file
        self.namespace = namespace
        self.topic = topic
        self._own_session = session is None
        self._session = session
        self._heartbeat = heartbeat
        self.gone_after = gone_after
        self._dag: DagMessage | None = None
        self._listeners: list[Listener] = []
        self._failure_listeners: list[FailureListener] = []
        self._changed = asyncio.Event()
        self._first = asyncio.Event()
        self._fatal: TopicNotFoundError | AccessDeniedError | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.connected = False
        self.sessions_opened = 0
        self.topic_unknown_since: float | None = None
        """``time.monotonic()`` of the first of the current run of "unknown topic" answers on
        reconnect (``None`` while the topic is served)."""

    @property
    def dag(self) -> DagMessage:
        if self._dag is None:
            raise RuntimeError("the DAG watcher has not received a DAG yet (call start())")
        return self._dag

    @property
    def epoch(self) -> int:
        return -1 if self._dag is None else self._dag.epoch

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    @property
    def failure(self) -> TopicNotFoundError | AccessDeniedError | None:
        """Why the watcher gave up (the topic is unknown or was deleted, or the operator refused
        the credentials); ``None`` while it runs."""
        return self._fatal

    def add_failure_listener(self, listener: FailureListener) -> None:
        """Call ``listener`` (on the event loop) when the watcher gives up on a topic it had
        (deleted); at once if it already has."""
        if isinstance(self._fatal, TopicNotFoundError) and self._dag is not None:
            listener(self._fatal)
        else:
            self._failure_listeners.append(listener)

    async def start(self, within: float = 30.0) -> DagMessage:
        if self._task is None:
            if self._session is None:
                self._session = client_session(ca_file=self._ca_file)
            self._task = asyncio.create_task(self._run(), name=f"dag-watch-{self.topic}")
        async with asyncio.timeout(within):
            await self._first.wait()
        if self._fatal is not None:
            raise self._fatal
        return self.dag

    async def wait_for(
        self, predicate: Callable[[DagMessage], bool], within: float | None = None
    ) -> DagMessage:
        """The first DAG (current or later) for which ``predicate`` holds."""
        async with asyncio.timeout(within):
            while True:
                if self._fatal is not None:
                    raise self._fatal
                if self._dag is not None and predicate(self._dag):
                    return self._dag
                self._changed.clear()
                await self._changed.wait()

    async def wait_update(self, within: float | None = None) -> None:
        """Wait for the next accepted message (a new epoch or new placement), or until the
        watcher gives up (see :attr:`failure`)."""
        if self._fatal is not None:
            return
        self._changed.clear()
        async with asyncio.timeout(within):
            await self._changed.wait()

    def _accept(self, dag: DagMessage) -> None:
        current = self._dag
        if current is not None and dag.epoch < current.epoch:
            log.debug("ignoring DAG epoch %d (have %d)", dag.epoch, current.epoch)
            return
        if current == dag:
            return
        self._dag = dag
        self._first.set()
        self._changed.set()
        for listener in list(self._listeners):
            try:
                listener(dag)
            except Exception:
                log.exception("DAG listener failed")

    async def _run(self) -> None:
        backoff = Backoff()
        url = ws_url(self.service_url) + dag_path(self.namespace, self.topic)
        assert self._session is not None
        while not self._closed:
            served = False
            try:
                async with await ws_connect(
                    self._session,
                    url,
                    heartbeat=self._heartbeat,
                    max_msg_size=64 << 20,
                    timeout=WS_TIMEOUT,
                ) as ws:
                    self.connected = True
                    self.sessions_opened += 1
                    async for frame in ws:
                        if frame.type is not aiohttp.WSMsgType.TEXT:
                            break
                        message = parse_server_message(frame.data)
                        if isinstance(message, DagMessage):
                            served = True
                            self.topic_unknown_since = None
                            self._accept(message)
                            backoff.reset()
                        elif (
                            isinstance(message, ErrorMessage)
                            and message.fatal
                            and message.code == ErrorCode.UNKNOWN_TOPIC
                        ):
                            raise TopicNotFoundError(message.message, deleted=served)
                        elif isinstance(message, ErrorMessage) and message.code in _DENIED:
                            raise AccessDeniedError(message.code.value, message.message)
                    if ws.close_code == CloseCode.UNKNOWN_TOPIC:
                        raise TopicNotFoundError(
                            f"topic {self.namespace}/{self.topic} "
                            + ("was deleted" if served else "not found"),
                            deleted=served,
                        )
            except TopicNotFoundError as exc:
                self.connected = False
                if self._gone(exc):
                    return
            except AccessDeniedError as exc:
                # No retry helps until RBAC or the token changes: start() and wait_for() raise
                # it; a watcher that had the DAG keeps its last one (docs/security.md).
                log.warning("DAG watch of %s/%s refused: %s", self.namespace, self.topic, exc)
                self._fatal = exc
                self._first.set()
                self._changed.set()
                return
            except (aiohttp.ClientError, OSError, SessionProtocolError, TimeoutError) as exc:
                log.debug("DAG watch of %s/%s dropped: %s", self.namespace, self.topic, exc)
            finally:
                self.connected = False
            if self._closed:
                return
            await asyncio.sleep(backoff.delay())

    def _gone(self, exc: TopicNotFoundError) -> bool:
        """Give up on the topic if ``exc`` settles it (see the class docstring)."""
        now = time.monotonic()
        if self._dag is not None and not exc.deleted:
            if self.topic_unknown_since is None:
                self.topic_unknown_since = now
            if now - self.topic_unknown_since < self.gone_after:
                log.info("DAG watch: %s (a lagging replica?); retrying", exc)
                return False
            exc = TopicNotFoundError(
                f"topic {self.namespace}/{self.topic} was deleted", deleted=True
            )
        self._fatal = exc
        self._first.set()
        self._changed.set()
        if self._dag is not None:
            log.warning("DAG watch of %s/%s: %s", self.namespace, self.topic, exc)
            listeners, self._failure_listeners = self._failure_listeners, []
            for listener in listeners:
                try:
                    listener(exc)
                except Exception:
                    log.exception("DAG failure listener failed")
        return True

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._own_session and self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> DagWatcher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

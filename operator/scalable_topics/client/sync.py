"""Blocking wrappers for scripts: the asyncio SDK on an event loop in a background thread.

::

    with SyncProducer("http://operator:8080", "default", "orders") as producer:
        producer.send(b"paid", key="order-7")

    with SyncConsumer.for_stream("http://operator:8080", "default", "orders", "billing", "w1") as c:
        msg = c.receive(timeout=10)
        c.ack(msg)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from .consumers import CheckpointConsumer, QueueConsumer, StreamConsumer
from .model import Checkpoint, Message, MessageId
from .producer import ScalableTopicProducer

__all__ = ["SyncConsumer", "SyncProducer"]

T = TypeVar("T")


class _LoopThread:
    """An event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for it; a timeout or an interrupt (Ctrl-C's
        ``KeyboardInterrupt`` arrives in the waiting thread) cancels it."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self.loop.is_running():
            self.loop.close()


class SyncProducer:
    """:class:`ScalableTopicProducer` with blocking calls (same arguments)."""

    def __init__(self, service_url: str, namespace: str, topic: str, **options: Any) -> None:
        self._thread = _LoopThread()

        async def make() -> ScalableTopicProducer:
            return await ScalableTopicProducer(service_url, namespace, topic, **options).start()

        try:
            self._producer = self._thread.run(make(), timeout=60)
        except BaseException:
            self._thread.stop()
            raise

    @property
    def name(self) -> str:
        return self._producer.name

    def send(
        self,
        value: bytes,
        key: str | bytes | None = None,
        *,
        timestamp_ms: int | None = None,
        properties: Mapping[str, str] | None = None,
        timeout: float | None = 60.0,
    ) -> MessageId:
        """Send and wait until the message is durable."""
        return self._thread.run(
            self._producer.send(value, key, timestamp_ms=timestamp_ms, properties=properties),
            timeout,
        )

    def send_async(
        self, value: bytes, key: str | bytes | None = None, **kwargs: Any
    ) -> Future[MessageId]:
        """Queue a message; the returned ``concurrent.futures.Future`` completes when durable.
        Calls from one thread keep their order."""

        async def queue() -> MessageId:
            return await self._producer.send(value, key, **kwargs)

        return self._thread.submit(queue())

    def send_many(
        self,
        values: Sequence[bytes],
        keys: Sequence[str | bytes | None] | None = None,
        *,
        timeout: float | None = 60.0,
    ) -> list[MessageId]:
        """:meth:`ScalableTopicProducer.send_many`, waiting until every message is durable:
        one hop to the producer's thread per batch instead of one per message."""

        async def send() -> list[MessageId]:
            return await (await self._producer.send_many(values, keys))

        return self._thread.run(send(), timeout)

    def flush(self, timeout: float | None = 60.0) -> None:
        self._thread.run(self._producer.flush(), timeout)

    def close(self, within: float = 30.0) -> None:
        """:meth:`ScalableTopicProducer.close`: flush for up to ``within`` seconds, then
        disconnect."""
        try:
            self._thread.run(self._producer.close(within), timeout=within + 30)
        finally:
            self._thread.stop()

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """Flushes, except when leaving on ``KeyboardInterrupt`` (Ctrl-C) or ``SystemExit``."""
        interrupted = exc_type is not None and not issubclass(exc_type, Exception)
        self.close(0.0 if interrupted else 30.0)


_AnyConsumer = StreamConsumer | CheckpointConsumer | QueueConsumer


class SyncConsumer:
    """Blocking ``receive``/``ack`` over a stream, checkpoint or queue consumer; build one with
    :meth:`for_stream`, :meth:`for_checkpoint` or :meth:`for_queue`."""

    def __init__(self, factory: Callable[[], _AnyConsumer], start_timeout: float = 60.0) -> None:
        self._thread = _LoopThread()

        async def make() -> _AnyConsumer:
            consumer = factory()
            await consumer.start()
            return consumer

        try:
            self._consumer = self._thread.run(make(), timeout=start_timeout)
        except BaseException:
            self._thread.stop()
            raise

    @classmethod
    def for_stream(cls, *args: Any, **kwargs: Any) -> SyncConsumer:
        return cls(lambda: StreamConsumer(*args, **kwargs))

    @classmethod
    def for_checkpoint(cls, *args: Any, **kwargs: Any) -> SyncConsumer:
        return cls(lambda: CheckpointConsumer(*args, **kwargs))

    @classmethod
    def for_queue(cls, *args: Any, **kwargs: Any) -> SyncConsumer:
        return cls(lambda: QueueConsumer(*args, **kwargs))

    @property
    def consumer(self) -> _AnyConsumer:
        """The wrapped asyncio consumer (use it only through :meth:`call`)."""
        return self._consumer

    def receive(self, timeout: float | None = None) -> Message:
        """The next message; raises ``TimeoutError`` after ``timeout`` seconds."""
        return self._thread.run(self._consumer.receive(), timeout)

    def receive_many(self, max_messages: int = 1000, timeout: float | None = None) -> list[Message]:
        """The next message and those queued behind it (``receive_many`` of the consumer)."""
        return self._thread.run(self._consumer.receive_many(max_messages), timeout)

    def ack(self, message: Message) -> None:
        consumer = self._acknowledging()
        self._thread.run(consumer.ack(message), 30)

    def ack_many(self, messages: Sequence[Message]) -> None:
        consumer = self._acknowledging()
        self._on_loop(lambda: consumer.ack_many(messages))

    def _acknowledging(self) -> StreamConsumer | QueueConsumer:
        consumer = self._consumer
        if isinstance(consumer, CheckpointConsumer):
            raise TypeError("a checkpoint consumer does not acknowledge; use checkpoint()")
        return consumer

    def nack(self, message: Message) -> None:
        """Give a queue consumer's message back for redelivery."""
        consumer = self._consumer
        if not isinstance(consumer, QueueConsumer):
            raise TypeError("only a queue consumer gives messages back")
        self._on_loop(lambda: consumer.nack(message))

    def checkpoint(self) -> Checkpoint:
        consumer = self._consumer
        if not isinstance(consumer, CheckpointConsumer):
            raise TypeError("only a checkpoint consumer has checkpoints")
        return self._on_loop(consumer.checkpoint)

    def _on_loop(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the consumer's loop (the consumer is not thread-safe)."""

        async def run() -> T:
            return fn()

        return self._thread.run(run(), 30)

    def call(self, fn: Callable[[_AnyConsumer], Awaitable[T]], timeout: float | None = 60) -> T:
        """Run ``fn(consumer)`` on the consumer's loop and wait for it."""

        async def run() -> T:
            return await fn(self._consumer)

        return self._thread.run(run(), timeout)

    def close(self, *, unregister: bool = True) -> None:
        """Leave (see the consumers' ``close``: by default what this consumer held goes to
        the others at once)."""
        try:
            self._thread.run(self._consumer.close(unregister=unregister), timeout=30)
        finally:
            self._thread.stop()

    def __enter__(self) -> SyncConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

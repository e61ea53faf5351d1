"""The demo's load: a producer at ``rate`` msg/s and stream consumers, counted and entered in
the :class:`.demo_ledger.Ledger`, and how they stop."""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from typing import Any

from ..credentials import client_session
from .demo_base import TOPIC, DemoBase

CLIENT_STOP_TIMEOUT = 0.5
"""On Ctrl-C, how long clients get to close their sessions before they are cancelled."""


class DemoTraffic(DemoBase):
    """The producer and the consumers."""

    async def produce(self, service_url: str, stop: asyncio.Event | None = None) -> None:
        """Send at ``self.rate`` msg/s over 200 keys until ``stop`` (default: the demo's end);
        message ``n`` is ``order <n> for <key>`` so a consumer can tell which it got
        (:class:`.demo_ledger.Ledger`)."""
        from ..client import ScalableTopicProducer

        stop = stop or self.stop

        async with (
            client_session(self.token_file) as session,
            ScalableTopicProducer(
                service_url, self.namespace, TOPIC, name="demo-producer", session=session
            ) as producer,
        ):
            keys = [f"customer-{i}" for i in range(200)]
            key_cycle = itertools.cycle(keys)
            tick = 0.02
            while not stop.is_set():
                started = time.monotonic()
                for _ in range(int(self.rate * tick)):
                    key = next(key_cycle)
                    number = self.sent
                    future = await producer.send_async(
                        f"order {number} for {key}".encode(), key=key
                    )
                    self.sent += 1
                    future.add_done_callback(functools.partial(self._acked, number))
                await asyncio.sleep(max(0.0, tick - (time.monotonic() - started)))

    def _acked(self, number: int, future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is None:
            self.acked += 1
            self.ledger.acked.add(number)
        else:
            self.failed += 1

    async def consume(self, service_url: str, name: str, stop: asyncio.Event) -> None:
        from ..client import StreamConsumer

        session = client_session(self.token_file)
        consumer = StreamConsumer(
            service_url, self.namespace, TOPIC, "billing", name, session=session
        )
        try:
            await consumer.start()
        except BaseException:
            await consumer.close()
            await session.close()
            raise
        stopping = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set():
                receiving = asyncio.create_task(consumer.receive())
                await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not receiving.done():
                    receiving.cancel()
                    break
                message = receiving.result()
                self.consumed += 1
                self.ledger.received_message(message.key, message.value)
                consumer.ack_nowait(message)
        finally:
            stopping.cancel()
            await consumer.close(unregister=True)
            await session.close()

    @staticmethod
    async def _stop_clients(
        tasks: list[asyncio.Task[None]],
        consumers: list[tuple[asyncio.Task[None], asyncio.Event]],
    ) -> None:
        """Clients stop on their own (closing their sessions) within ``CLIENT_STOP_TIMEOUT``,
        all at once; cancelling is the fallback."""
        for _, event in consumers:
            event.set()
        everything = [*tasks, *(t for t, _ in consumers)]
        if not everything:
            return
        _, late = await asyncio.wait(everything, timeout=CLIENT_STOP_TIMEOUT)
        for task in late:
            task.cancel()
        await asyncio.gather(*everything, return_exceptions=True)

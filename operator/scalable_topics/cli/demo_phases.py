"""The demo's three phases (:meth:`DemoPhases.drive`): split on load, split on consumers,
merge when cold, and with ``verify`` the check that nothing was lost or reordered."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from kubernetes_asyncio import client as k8s

from . import demo_progress
from .demo_ledger import Outcome
from .demo_traffic import DemoTraffic

MAX_RATE = 1500.0
RAMP_STEP, RAMP_EVERY = 100.0, 5.0
CONSUMER_EVERY = 8.0


class DemoPhases(DemoTraffic):
    """The phases, driving the producer and consumers of :class:`DemoTraffic`."""

    async def drive(self, api: k8s.ApiClient, service_url: str, *, verify: bool = False) -> Outcome:
        """The three phases against the Ready topic: a producer ramps up until the topic splits
        on load, stream consumers join until a consumer-count split, then the load stops until
        neighbours merge.

        With ``verify`` (the in-cluster load), between the second and third phase the producer
        stops, every send is settled and the consumers read until they have received every
        acknowledged message (or the phase timeout says how many they have not): the
        :class:`Outcome` then tells whether any was lost or arrived out of key order.
        """
        stop_producing = asyncio.Event()
        producer = asyncio.create_task(self.produce(service_url, stop_producing))
        consumers: list[tuple[asyncio.Task[None], asyncio.Event]] = []
        clients = [producer]

        def failed() -> None:
            """A client that ended on its own failed: say why instead of waiting out a phase."""
            for task in clients:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise RuntimeError(f"a demo client failed: {task.exception()!r}")

        epochs = [await self.epoch(api)]
        verified = False
        try:
            self.say("phase 1: ramping the producer up until the topic splits on load")
            next_ramp = time.monotonic()

            async def split_on_load() -> bool:
                nonlocal next_ramp
                failed()
                if await self.epoch(api) != epochs[-1]:
                    return True
                if time.monotonic() >= next_ramp:
                    self.rate = min(self.rate + RAMP_STEP, MAX_RATE)
                    next_ramp += RAMP_EVERY
                return False

            await self.wait_for(
                "a split on load",
                split_on_load,
                self.phase_timeout,
                lambda: self.status_line(
                    api, demo_progress.split_progress, f"producing {self.rate:.0f} msg/s; "
                ),
            )
            epochs.append(await self.epoch(api))

            self.say("phase 2: adding stream consumers until a consumer-count split")
            next_consumer = time.monotonic()

            async def split_on_consumers() -> bool:
                nonlocal next_consumer
                failed()
                if await self.epoch(api) != epochs[-1]:
                    return True
                if time.monotonic() >= next_consumer:
                    event = asyncio.Event()
                    name = f"billing-{len(consumers) + 1}"
                    task = asyncio.create_task(self.consume(service_url, name, event))
                    consumers.append((task, event))
                    clients.append(task)
                    self.say(f"  stream consumer {name} joined ({len(consumers)} now)")
                    next_consumer += CONSUMER_EVERY
                return False

            await self.wait_for(
                "a consumer-count split",
                split_on_consumers,
                self.phase_timeout,
                lambda: self.status_line(api, demo_progress.consumer_split_progress),
            )
            epochs.append(await self.epoch(api))

            self.rate = 0.0
            if verify:
                await self._drain(failed)
                verified = True

            self.say("phase 3: load off and consumers gone until cold neighbours merge")
            await self._stop_clients([], consumers)

            async def merged() -> bool:
                return await self.epoch(api) != epochs[-1]

            await self.wait_for(
                "a merge",
                merged,
                self.phase_timeout,
                lambda: self.status_line(api, demo_progress.merge_progress),
            )
            epochs.append(await self.epoch(api))
            return self.outcome(epochs, verified)
        finally:
            await self._stop_clients([], [(producer, stop_producing), *consumers])

    async def _drain(self, failed: Callable[[], None]) -> None:
        """Every send settled, then every acknowledged message received (see :meth:`drive`)."""
        self.say("producer stopped: waiting until the consumers have every acknowledged message")

        async def settled() -> bool:
            failed()
            return self.acked + self.failed >= self.sent

        await self.wait_for(
            "the producer's last sends to be acknowledged",
            settled,
            self.phase_timeout,
            lambda: _text(f"{self.acked + self.failed} of {self.sent} settled"),
        )

        async def received() -> bool:
            failed()
            return self.ledger.missing() == 0

        await self.wait_for(
            "the consumers to receive every acknowledged message",
            received,
            self.phase_timeout,
            lambda: _text(
                f"{len(self.ledger.received)} received, {self.ledger.missing()} of "
                f"{len(self.ledger.acked)} acknowledged still missing"
            ),
        )
        self.say(
            f"  all {len(self.ledger.acked)} acknowledged messages received "
            f"({self.ledger.redelivered} redelivered, {self.ledger.out_of_order} out of key order)"
        )

    def outcome(self, epochs: list[int], verified: bool) -> Outcome:
        return Outcome(
            epochs=epochs,
            sent=self.sent,
            acked=self.acked,
            failed=self.failed,
            received=len(self.ledger.received),
            redelivered=self.ledger.redelivered,
            out_of_order=self.ledger.out_of_order,
            lost=self.ledger.missing(),
            keys=len(self.ledger.last),
            verified=verified,
        )


async def _text(text: str) -> str:
    return text

"""The keyed work queue: coalescing, no concurrent processing of a key, retry with back-off."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest

from scalable_topics.controller.workqueue import WorkQueue
from scalable_topics.core.backoff import Backoff


async def test_adds_coalesce_and_a_key_is_never_processed_twice_at_once() -> None:
    running: set[str] = set()
    overlaps: list[str] = []
    calls: list[str] = []
    release = asyncio.Event()
    both_started = asyncio.Event()

    async def process(key: str) -> None:
        if key in running:
            overlaps.append(key)
        running.add(key)
        calls.append(key)
        if len(calls) == 2:
            both_started.set()
        await release.wait()
        running.discard(key)

    queue: WorkQueue[str] = WorkQueue(process, workers=4)
    queue.start()
    for _ in range(5):
        queue.add("a")
    queue.add("b")
    await asyncio.wait_for(both_started.wait(), 2)
    queue.add("a")  # arrives while "a" is processing: one more pass afterwards
    queue.add("a")
    release.set()
    await asyncio.wait_for(queue.wait_idle(), 2)
    await queue.stop()
    assert overlaps == []
    assert sorted(calls) == ["a", "a", "b"]


async def test_failures_are_retried_with_backoff_then_forgotten() -> None:
    attempts: list[float] = []
    loop = asyncio.get_running_loop()
    succeeded = asyncio.Event()

    async def process(key: str) -> None:
        attempts.append(loop.time())
        if len(attempts) == 3:
            succeeded.set()
        if len(attempts) < 3:
            raise RuntimeError("broker unreachable")

    queue: WorkQueue[str] = WorkQueue(
        process, workers=1, backoff=Backoff(base=0.05, cap=1, jitter=False)
    )
    queue.start()
    queue.add("t")
    async with asyncio.timeout(3):
        await succeeded.wait()
        await queue.wait_idle()
    await queue.stop()
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps[0] >= 0.045
    assert gaps[1] >= 0.095, "the second retry waits twice as long"


async def test_cancel_stops_the_processing_of_matching_keys_only() -> None:
    started = asyncio.Event()
    finished: list[str] = []

    async def process(key: str) -> None:
        if key == "lost":
            started.set()
            await asyncio.Event().wait()
        finished.append(key)

    queue: WorkQueue[str] = WorkQueue(process, workers=2)
    queue.start()
    queue.add("lost")
    await asyncio.wait_for(started.wait(), 2)
    assert queue.cancel(lambda key: key == "lost") == 1
    queue.add("kept")
    await asyncio.wait_for(queue.wait_idle(), 2)
    await queue.stop()
    assert finished == ["kept"]


async def _stuck_in_a_call(never: asyncio.Event) -> None:
    await never.wait()


async def test_a_long_pass_is_logged_once_with_where_it_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pass that outlives ``long_pass`` is a defect to find: it is logged once, with the
    awaits it hangs in, down the chain; a quick pass is not. A stop right after a cancel stops
    the workers (it was swallowed as the pass's cancellation)."""
    never = asyncio.Event()

    async def process(key: str) -> None:
        if key == "stuck":
            await _stuck_in_a_call(never)

    warned = asyncio.Event()

    class Warned(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warned.set()

    logger = logging.getLogger("scalable_topics.controller.workqueue")
    handler = Warned(logging.WARNING)
    logger.addHandler(handler)
    queue: WorkQueue[str] = WorkQueue(process, workers=2, long_pass=0.05)
    queue.start()
    try:
        with caplog.at_level(logging.WARNING, logger=logger.name):
            queue.add("quick")
            await asyncio.wait_for(queue.wait_idle(), 2)
            queue.add("stuck")
            await asyncio.wait_for(warned.wait(), 2)
            assert queue.cancel(lambda key: key == "stuck") == 1
            # A stop right after (a shard lost at shutdown) is not taken for the pass's cancel.
            await asyncio.wait_for(queue.stop(), 2)
    finally:
        logger.removeHandler(handler)
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith("work: stuck still processing after 0s, waiting in:"), message
    assert "test_controller_workqueue.py" in message
    assert "in _stuck_in_a_call\n" in message, message
    assert "asyncio/locks.py" in message, "the chain is followed down into the Event's wait"


async def test_event_keys_go_before_resync_keys_and_an_event_promotes_a_waiting_one() -> None:
    """A resync pass queues every topic; a topic added by an event in the meantime is taken
    first (a new topic must not wait behind thousands of no-op reconciles), a topic waiting
    for its resync is promoted by an event and processed once, and a resync never demotes."""
    order: list[str] = []

    async def process(key: str) -> None:
        order.append(key)

    queue: WorkQueue[str] = WorkQueue(process, workers=1)
    for i in range(5):
        queue.add_periodic(f"resync-{i}")
    queue.add("new")
    queue.add("resync-3")
    queue.add("urgent")
    queue.add_periodic("urgent")
    assert queue.waiting == 7
    queue.start()
    await asyncio.wait_for(queue.wait_idle(), 2)
    await queue.stop()
    assert order == ["new", "resync-3", "urgent", "resync-0", "resync-1", "resync-2", "resync-4"]


async def test_resync_keys_get_a_share_of_the_workers_while_event_keys_are_busy() -> None:
    """With event keys waiting or in flight, at most ``periodic_share`` workers take resync
    keys; once the events' work is done the resync has every worker."""
    gate = asyncio.Event()
    ten_done = asyncio.Event()
    done = 0
    running: set[str] = set()
    most_resync_with_events = 0
    most_resync_alone = 0

    async def process(key: str) -> None:
        nonlocal most_resync_with_events, most_resync_alone, done
        running.add(key)
        resync = sum(1 for k in running if k.startswith("resync"))
        if any(k.startswith("event") for k in running):
            most_resync_with_events = max(most_resync_with_events, resync)
        else:
            most_resync_alone = max(most_resync_alone, resync)
        try:
            if key.startswith("event"):
                await gate.wait()
            else:
                await asyncio.sleep(0.01)
                done += 1
                if done == 10:
                    ten_done.set()
        finally:
            running.discard(key)

    queue: WorkQueue[str] = WorkQueue(process, workers=8, periodic_share=2)
    for i in range(100):
        queue.add_periodic(f"resync-{i}")
    for i in range(3):
        queue.add(f"event-{i}")
    queue.start()
    try:
        await asyncio.wait_for(ten_done.wait(), 5)  # past the three blocked event keys
        assert sum(1 for k in running if k.startswith("event")) == 3
        assert most_resync_with_events == 2
        gate.set()
        await asyncio.wait_for(queue.wait_idle(), 5)
    finally:
        await queue.stop()
    assert most_resync_with_events == 2
    assert most_resync_alone > 2, "with no event work the resync has every worker"

"""The producer-visible pause of a segment move: lookup-less (seed 004) against rediscovery.

Two real broker processes, the real operator session server (in-process, fed from in-memory
layouts, ``tests/integration/client_harness``) and one
:class:`~scalable_topics.client.ScalableTopicProducer` sending keyed messages at a constant rate
(open loop) to a one-segment topic. The segment moves back and forth between the brokers in the
protocol's order (catch-up copy relayed as the leader does, fence, final tail, the DAG push of
the new owner as at the commit, own, release). Moves alternate between the two ways the source
can close its producers:

- **lookup-less**: ``SegmentMoved`` with the new owner's URL; the SDK reconnects there at once;
- **rediscovery**: a plain ``GoingAway`` close; the SDK backs off and reconnects to the owner its
  DAG session names (the push of the commit has normally arrived by then).

The **pause** of a move is the time from the last acknowledgement of an entry stored by the old
owner to the first acknowledgement of one stored by the new owner. The **fenced window** is the
time from the fence to the destination owning the segment (what the source's log size must not
change); the catch-up copy's throughput is reported next to it.

    python -m bench.run --only move [--quick]
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._stats import percentile
from bench.report import Report

TARGET_P99_MS = 50.0
NS, TOPIC = "bench", "move"


@dataclass(frozen=True)
class Mode:
    rate: float
    keys: int
    moves: int
    settle: float
    log_sizes_mb: tuple[int, ...]


QUICK = Mode(rate=1000.0, keys=16, moves=4, settle=0.5, log_sizes_mb=(10,))
FULL = Mode(rate=2000.0, keys=32, moves=6, settle=0.8, log_sizes_mb=(10, 100, 1024))


@dataclass
class MoveSample:
    lookup_less: bool
    log_mb: float
    pause_ms: float = float("nan")
    fenced_ms: float = float("nan")
    copy_mb_s: float = float("nan")


@dataclass
class Acks:
    times: list[tuple[float, int]] = field(default_factory=list)
    errors: int = 0


def disk_write_mb_s(directory: Path, megabytes: int = 64) -> float:
    """Sequential write speed of the disk under ``directory``: 1 MiB writes, one fsync."""
    path = directory / "disk-speed"
    block = b"\0" * (1 << 20)
    started = time.monotonic()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(megabytes):
            os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
        path.unlink()
    return megabytes * (1 << 20) / (time.monotonic() - started) / 1e6


async def _preload(url: str, megabytes: int) -> None:
    """Grow the segment's log to about ``megabytes`` with 64 KiB entries."""
    from scalable_topics.client.segment import SegmentProducer
    from scalable_topics.core.wire import Message

    producer = await SegmentProducer.connect(url, NS, TOPIC, 0, "preload")
    entry = [Message(b"p" * 65536)]
    try:
        futures = [await producer.send_entry(entry) for _ in range(megabytes * 16)]
        await asyncio.gather(*futures)
    finally:
        await producer.close()


async def _measure(mode: Mode, base: Path) -> tuple[list[MoveSample], dict[str, Any]]:
    from scalable_topics.client import ScalableTopicProducer
    from scalable_topics.transferadmin import TransferAdmin, copy
    from tests.integration.client_harness import TopicEnv, broker_processes, start_operator

    with broker_processes(base, 2) as brokers:
        operator = await start_operator()
        env = TopicEnv(operator, [b.url for b in brokers], NS, TOPIC, subscriptions={"s": "Stream"})
        samples: list[MoveSample] = []
        acks = Acks()
        try:
            await env.create(1)
            keys = [f"key-{i}" for i in range(mode.keys)]
            stop = asyncio.Event()
            async with ScalableTopicProducer(env.service_url, NS, TOPIC, linger_ms=1) as producer:

                def record(future: asyncio.Future[Any]) -> None:
                    if future.cancelled() or future.exception() is not None:
                        acks.errors += 1
                        return
                    acks.times.append((time.monotonic(), future.result().position))

                async def send() -> None:
                    started = time.monotonic()
                    sent = 0
                    while not stop.is_set():
                        due = int((time.monotonic() - started) * mode.rate)
                        while sent < due:
                            future = await producer.send_async(
                                b"x" * 100, key=keys[sent % len(keys)]
                            )
                            future.add_done_callback(record)
                            sent += 1
                        await asyncio.sleep(0.001)

                sender = asyncio.create_task(send())
                loaded = 0
                for size in mode.log_sizes_mb:
                    await _preload(env.placement[0], size - loaded)
                    loaded = size
                    for i in range(mode.moves):
                        await asyncio.sleep(mode.settle)
                        lookup_less = i % 2 == 0
                        samples.append(
                            await _move(env, TransferAdmin, copy, acks, lookup_less, loaded)
                        )
                await asyncio.sleep(mode.settle)
                stop.set()
                await sender
                await producer.flush()
            return samples, {"errors": acks.errors, "moves_followed": producer.moves}
        finally:
            await env.close()
            await operator.stop()


async def _move(
    env: Any, transfer_admin: Any, copy: Any, acks: Acks, lookup_less: bool, log_mb: float
) -> MoveSample:
    source_url = env.placement[0]
    destination = next(u for u in env.broker_urls if u != source_url)
    src = transfer_admin(env.admins[source_url], NS, TOPIC, 0)
    dst = transfer_admin(env.admins[destination], NS, TOPIC, 0)
    sample = MoveSample(lookup_less, log_mb)
    catch_up = await copy(src, dst)
    if catch_up.seconds > 0 and catch_up.bytes:
        sample.copy_mb_s = catch_up.bytes / catch_up.seconds / 1e6
    await copy(src, dst)
    fenced_at = time.monotonic()
    fenced = await src.fence()
    last_old = int(fenced["lastPosition"])
    await copy(src, dst)
    env.placement[0] = destination  # the commit: watchers get the new owner
    env.publish()
    await dst.own()
    sample.fenced_ms = 1000.0 * (time.monotonic() - fenced_at)
    released = await src.release(destination, redirect=lookup_less)
    if released is not None:
        await dst.state(released["cursors"], None)

    async def first_new_ack() -> float:
        while True:
            later = [t for t, p in acks.times if p > last_old]
            if later:
                return min(later)
            await asyncio.sleep(0.005)

    first = await asyncio.wait_for(first_new_ack(), 30)
    last = max(t for t, p in acks.times if p <= last_old)
    sample.pause_ms = 1000.0 * (first - last)
    return sample


async def run(report: Report, quick: bool) -> None:
    mode = QUICK if quick else FULL
    section = report.section("move", "Producer-visible pause of a segment move (seed 004)")
    with tempfile.TemporaryDirectory(prefix="bench-move-") as tmp:
        disk = disk_write_mb_s(Path(tmp))
        samples, extra = await _measure(mode, Path(tmp))
    fast = [s.pause_ms for s in samples if s.lookup_less]
    slow = [s.pause_ms for s in samples if not s.lookup_less]
    if not fast or not slow:
        raise RuntimeError("no move of one of the two kinds was measured")
    p99_fast, p99_slow = percentile(fast, 0.99), percentile(slow, 0.99)
    section.figure("pause_lookup_less_p50", percentile(fast, 0.5), "ms")
    section.figure("pause_lookup_less_p99", p99_fast, "ms")
    section.figure("pause_rediscovery_p50", percentile(slow, 0.5), "ms")
    section.figure("pause_rediscovery_p99", p99_slow, "ms")
    for size in mode.log_sizes_mb:
        fenced = [s.fenced_ms for s in samples if s.log_mb == size]
        section.figure(f"fenced_p50_{size}mb", percentile(fenced, 0.5), "ms")
    copy_rates = [s.copy_mb_s for s in samples if s.copy_mb_s == s.copy_mb_s]
    section.figure("catch_up_copy_p50", percentile(copy_rates, 0.5), "MB/s")
    section.figure("disk_sequential_write", disk, "MB/s")
    section.table(
        "Moves",
        ["close", "log MB", "pause ms", "fenced ms", "catch-up MB/s"],
        [
            [
                "lookup-less" if s.lookup_less else "rediscovery",
                s.log_mb,
                round(s.pause_ms, 1),
                round(s.fenced_ms, 1),
                round(s.copy_mb_s, 1) if s.copy_mb_s == s.copy_mb_s else None,
            ]
            for s in samples
        ],
    )
    section.target(
        "lookup-less pause p99",
        p99_fast <= TARGET_P99_MS and p99_fast < p99_slow,
        f"{p99_fast:.1f} ms (rediscovery {p99_slow:.1f} ms)",
        f"<= {TARGET_P99_MS:.0f} ms and below rediscovery",
    )
    section.note(
        f"{mode.rate:.0f} msg/s of 100 B over {mode.keys} keys to one segment moved between 2 "
        f"broker processes (fsync=always), logs preloaded to {mode.log_sizes_mb} MB; "
        f"{extra['errors']} send errors, the producer followed {extra['moves_followed']} moved "
        "close frames."
    )
    section.note(
        "pause = first ack of an entry stored by the new owner minus the last ack of one stored "
        "by the old owner; fenced = fence to the destination owning the segment (final tail "
        "copy and the DAG push included; it does not grow with the log: the catch-up copy "
        "happens before the fence). The catch-up copy is relayed through this process (the "
        f"leader's path): p50 {percentile(copy_rates, 0.5):.0f} MB/s, next to {disk:.0f} MB/s of "
        "sequential writes (1 MiB writes, one fsync) on the same disk."
    )
    section.data.update({"samples": [s.__dict__ for s in samples], "mode": mode.__dict__})

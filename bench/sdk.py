"""The SDK path users take, end to end, next to the raw segment path (issues 12 and 17).

Two broker processes (``--fsync always``), the real operator session server (in-process, fed
from in-memory layouts, ``tests/integration/client_harness.py``) and one topic of 4 segments
per path, 2 segments per broker. Every message carries a random key (from a pool of 65,536) and
a 100 B value that starts with its send time, so the consumers measure send -> receive.

* **sdk**: one :class:`~scalable_topics.client.ScalableTopicProducer` (``send_async`` per
  message: routing by key, per-segment batches cut per entry bucket, windowed in-flight
  entries, acknowledged after the brokers' fsync) -> :data:`CONSUMERS`
  :class:`~scalable_topics.client.StreamConsumer`\\ s of one subscription, which the controller
  gives 2 segments each; ``receive`` and ``ack`` per message.
* **sdk-batch**: the same objects through the SDK's throughput API: ``send_many`` of
  :data:`BATCH` messages (one future for all), ``receive_many`` and ``ack_many``.
* **raw**: what the broker benchmark drives, spread over the same 4 segments: the load
  generator groups each batch of :data:`BATCH` messages by segment and entry bucket itself,
  encodes each group at once (``wire.encode_keyed_values``) and sends it with
  ``SegmentProducer.send_encoded`` on that segment's connection; one ``SegmentConsumer`` per
  segment decodes every message and acknowledges cumulatively per received batch.

All paths run in this one process (the client side shares one core with the operator's
session server; the brokers have their own processes), one after the other:

1. **capacity**: closed loop (at most :data:`WINDOW` messages unacknowledged) for ``step``
   seconds after a warm-up; produce msg/s = acknowledged, end-to-end msg/s = received by the
   consumers in the same window;
2. **latency**: open loop at half of the per-message SDK's capacity for every path (the same
   offered load): publish -> ack and send -> receive percentiles, measured from the intended
   send time.

The headline is the ratio of the SDK's end-to-end throughput (its throughput API) to the raw
path's; the per-message ratio is reported next to it.

    python -m bench.run --only sdk [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import struct
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._stats import percentile
from bench.report import Report

NS, SUB = "bench", "s"
SEGMENTS = 4
BROKERS = 2
CONSUMERS = 2
PAYLOAD = 100
KEYS = 65_536
BATCH = 256
WINDOW = 10_000
TARGET_RATIO = 0.5
_STAMP = struct.Struct("<q")


@dataclass(frozen=True)
class Mode:
    warmup: float
    step: float
    drain: float


QUICK = Mode(warmup=0.5, step=2.0, drain=5.0)
FULL = Mode(warmup=1.0, step=6.0, drain=10.0)


@dataclass
class Counts:
    """What one measured window saw; latencies in seconds."""

    acked: int = 0
    received: int = 0
    errors: int = 0
    gc_seconds: float = 0.0
    publish: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)

    def summary(self, seconds: float) -> dict[str, float]:
        return {
            "produce_msg_s": self.acked / seconds,
            "e2e_msg_s": self.received / seconds,
            "publish_p50_ms": 1000 * percentile(self.publish, 0.5),
            "publish_p99_ms": 1000 * percentile(self.publish, 0.99),
            "e2e_p50_ms": 1000 * percentile(self.e2e, 0.5),
            "e2e_p99_ms": 1000 * percentile(self.e2e, 0.99),
            "e2e_max_ms": 1000 * max(self.e2e, default=float("nan")),
            "errors": float(self.errors),
            "gc_share": self.gc_seconds / seconds,
        }


class Window:
    """The measured interval of a step: only events inside it are counted."""

    def __init__(self) -> None:
        self.start = float("inf")
        self.end = float("inf")
        self.counts = Counts()

    def inside(self, now: float) -> bool:
        return self.start <= now < self.end


class GcTimer:
    """Adds the time the cyclic garbage collector runs to the current window's counts (the
    client side's per-message objects make it a large share of the SDK path's time)."""

    def __init__(self) -> None:
        self.window: Window | None = None
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        now = time.monotonic()
        if phase == "start":
            self._began = now
        elif self.window is not None and self.window.inside(self._began):
            self.window.counts.gc_seconds += now - self._began


GC = GcTimer()


def _value(pad: bytes, due: float) -> bytes:
    return _STAMP.pack(int(due * 1e9)) + pad


def _sent_at(value: bytes) -> float:
    return float(_STAMP.unpack_from(value)[0]) / 1e9


class Flow:
    """One way of producing and consuming: ``send(keys, due)`` sends messages due at ``due``;
    ``received(value)`` is called by the consumers for every message."""

    name = ""

    def __init__(self) -> None:
        self.window = Window()
        self.unacked = 0
        self.room = asyncio.Event()
        self.room.set()

    def _acked(self, count: int, due: float, ok: bool) -> None:
        now = time.monotonic()
        self.unacked -= count
        if self.unacked < WINDOW:
            self.room.set()
        if not self.window.inside(due):
            return
        if not ok:
            self.window.counts.errors += count
            return
        self.window.counts.acked += count
        self.window.counts.publish.extend([now - due] * count)

    def _received(self, value: bytes) -> None:
        now = time.monotonic()
        sent = _sent_at(value)
        if self.window.inside(now):
            self.window.counts.received += 1
        if self.window.inside(sent):
            self.window.counts.e2e.append(now - sent)

    def _on_ack(self, count: int, due: float) -> Callable[[asyncio.Future[Any]], None]:
        """The done callback of a future acknowledging ``count`` messages due at ``due``."""

        def done(future: asyncio.Future[Any]) -> None:
            self._acked(count, due, not future.cancelled() and future.exception() is None)

        return done

    async def send(self, keys: list[bytes], due: float) -> None:
        raise NotImplementedError

    def _sent(self, count: int) -> None:
        """``count`` more messages are unacknowledged; at the window the loops wait for room."""
        self.unacked += count
        if self.unacked >= WINDOW:
            self.room.clear()

    async def idle(self) -> None:
        """Wait until every message sent is acknowledged."""
        while self.unacked > 0:
            self.room.clear()
            await self.room.wait()


class SdkPath(Flow):
    name = "sdk"

    def __init__(self, producer: Any) -> None:
        super().__init__()
        self.producer = producer
        self.pad = os.urandom(PAYLOAD - _STAMP.size)

    async def send(self, keys: list[bytes], due: float) -> None:
        value = _value(self.pad, due)
        send = self.producer.send_async
        done = self._on_ack(1, due)
        for key in keys:
            future = await send(value, key)
            future.add_done_callback(done)
        self._sent(len(keys))

    async def consume(self, consumer: Any) -> None:
        received = self._received
        while True:
            message = await consumer.receive()
            received(message.value)
            consumer.ack_nowait(message)


class BatchPath(SdkPath):
    """The SDK's throughput API: ``send_many`` per batch, ``receive_many`` + ``ack_many``."""

    name = "sdk-batch"

    async def send(self, keys: list[bytes], due: float) -> None:
        future = await self.producer.send_many([_value(self.pad, due)] * len(keys), keys)
        future.add_done_callback(self._on_ack(len(keys), due))
        self._sent(len(keys))

    async def consume(self, consumer: Any) -> None:
        received = self._received
        while True:
            messages = await consumer.receive_many(BATCH)
            for message in messages:
                received(message.value)
            consumer.ack_many(messages)


class RawPath(Flow):
    name = "raw"

    def __init__(
        self, producers: list[Any], ranges: list[tuple[int, int]], pool: list[bytes]
    ) -> None:
        from scalable_topics.core import wire
        from scalable_topics.core.hashing import bucket_hash, segment_hash

        super().__init__()
        self.producers = producers
        self.pad = os.urandom(PAYLOAD - _STAMP.size)
        self.encode = wire.encode_keyed_values
        self.route: dict[bytes, tuple[int, int]] = {}
        """Key -> (segment index, entry bucket): the grouping a raw client does itself."""
        for key in pool:
            h = segment_hash(key)
            index = next(i for i, (start, end) in enumerate(ranges) if start <= h <= end)
            buckets = producers[index].buckets
            self.route[key] = (index, wire.bucket_of(bucket_hash(key), buckets))

    async def send(self, keys: list[bytes], due: float) -> None:
        groups: dict[tuple[int, int], list[bytes]] = defaultdict(list)
        route = self.route
        for key in keys:
            groups[route[key]].append(key)
        value = _value(self.pad, due)
        for (index, _), group in groups.items():
            payload, count, hmin, hmax, sample, keyed = self.encode(group, [value] * len(group))
            future = await self.producers[index].send_encoded(
                payload, count, hmin, hmax, sample, keyed
            )
            future.add_done_callback(self._on_ack(count, due))
        self._sent(len(keys))

    async def consume(self, consumer: Any) -> None:
        received = self._received
        while True:
            await consumer.wait_ready()
            if consumer.failure is not None:
                raise consumer.failure
            entries = consumer.receive_nowait(BATCH)
            for entry in entries:
                for message in entry.messages():
                    received(message.value)
            if entries:
                consumer.ack_cumulative(entries[-1].position)


async def _closed_loop(path: Flow, pool: list[bytes], mode: Mode) -> dict[str, float]:
    rng = random.Random(1)
    window = path.window = GC.window = Window()
    now = time.monotonic()
    window.start = now + mode.warmup
    window.end = window.start + mode.step
    while time.monotonic() < window.end:
        if path.unacked >= WINDOW:
            path.room.clear()
            await path.room.wait()
            continue
        await path.send(rng.choices(pool, k=BATCH), time.monotonic())
        await asyncio.sleep(0)
    return await _finish(path, mode)


async def _open_loop(path: Flow, pool: list[bytes], mode: Mode, rate: float) -> dict[str, float]:
    """wrk2 style: every millisecond the messages due by then are sent, stamped with the time
    they were due (so a stalled client counts the wait)."""
    rng = random.Random(2)
    window = path.window = GC.window = Window()
    began = time.monotonic()
    window.start = began + mode.warmup
    window.end = window.start + mode.step
    sent = 0
    while (now := time.monotonic()) < window.end:
        due_total = int((now - began) * rate)
        while sent < due_total:
            n = min(BATCH, due_total - sent)
            await path.send(rng.choices(pool, k=n), began + sent / rate)
            sent += n
        await asyncio.sleep(0.001)
    return await _finish(path, mode)


async def _finish(path: Flow, mode: Mode) -> dict[str, float]:
    """Wait for the acknowledgements and for the consumers to receive the window's messages
    (bounded by ``mode.drain``), then summarise the window."""
    async with asyncio.timeout(mode.drain * 3):
        await path.idle()
    counts = path.window.counts
    deadline = time.monotonic() + mode.drain
    while len(counts.e2e) < counts.acked and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    summary = counts.summary(mode.step)
    summary["unreceived"] = float(counts.acked - len(counts.e2e))
    return summary


async def _measure(mode: Mode, base: Path) -> dict[str, dict[str, dict[str, float]]]:
    from scalable_topics.client import ScalableTopicProducer, StreamConsumer
    from scalable_topics.client.segment import SegmentConsumer, SegmentProducer
    from tests.integration.client_harness import TopicEnv, broker_processes, start_operator

    rng = random.Random(0)
    pool = [b"k-%016x" % rng.getrandbits(64) for _ in range(KEYS)]
    results: dict[str, dict[str, dict[str, float]]] = {"raw": {}, "sdk": {}, "sdk-batch": {}}
    with broker_processes(base, BROKERS, args=("--fsync", "always")) as brokers:
        operator = await start_operator()
        urls = [b.url for b in brokers]
        envs = {
            name: TopicEnv(operator, urls, NS, name, subscriptions={SUB: "Stream"})
            for name in ("sdk", "raw", "batch")
        }
        async with contextlib.AsyncExitStack() as stack:
            for env in envs.values():
                stack.push_async_callback(env.close)
                await env.create(SEGMENTS)
            stack.push_async_callback(operator.stop)
            raw_env = envs["raw"]
            segments = list(raw_env.layout.active())
            producers = []
            consumers = []
            for s in segments:
                url = raw_env.placement[s.segment_id]
                p = await SegmentProducer.connect(url, NS, "raw", s.segment_id, "bench-raw")
                stack.push_async_callback(p.close, flush=False)
                producers.append(p)
                c = await SegmentConsumer.connect(
                    url, NS, "raw", s.segment_id, SUB, "c", permits=4 * BATCH
                )
                stack.push_async_callback(c.close)
                consumers.append(c)
            raw = RawPath(
                producers, [(s.hash_range.start, s.hash_range.end) for s in segments], pool
            )
            sdk_paths: list[SdkPath] = []
            tasks = [asyncio.create_task(raw.consume(c)) for c in consumers]
            for topic, kind in (("sdk", SdkPath), ("batch", BatchPath)):
                url = envs[topic].service_url
                producer = await stack.enter_async_context(
                    ScalableTopicProducer(url, NS, topic, max_pending=WINDOW)
                )
                path = kind(producer)
                sdk_paths.append(path)
                for i in range(CONSUMERS):
                    reader = await stack.enter_async_context(
                        StreamConsumer(url, NS, topic, SUB, f"c{i}")
                    )
                    tasks.append(asyncio.create_task(path.consume(reader)))
            # The operator's session server and the harness live in this process only for the
            # benchmark: their objects leave the GC's generations, so a full collection visits
            # what a client application would have (both paths alike).
            gc.collect()
            gc.freeze()
            gc.callbacks.append(GC)
            try:
                paths: list[Flow] = [raw, *sdk_paths]
                for flow in paths:
                    results[flow.name]["capacity"] = await _closed_loop(flow, pool, mode)
                rate = 0.5 * results["sdk"]["capacity"]["e2e_msg_s"]
                for flow in paths:
                    step = await _open_loop(flow, pool, mode, rate)
                    step["offered_msg_s"] = rate
                    results[flow.name]["latency"] = step
                for task in tasks:
                    if task.done():
                        task.result()  # a consumer that failed fails the benchmark
            finally:
                gc.callbacks.remove(GC)
                gc.unfreeze()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
    return results


async def run(report: Report, quick: bool) -> None:
    mode = QUICK if quick else FULL
    section = report.section("sdk", "SDK end to end next to the raw segment path")
    with tempfile.TemporaryDirectory(prefix="bench-sdk-") as tmp:
        results = await _measure(mode, Path(tmp))
    raw, sdk, batch = results["raw"], results["sdk"], results["sdk-batch"]
    raw_e2e = raw["capacity"]["e2e_msg_s"]
    ratio = batch["capacity"]["e2e_msg_s"] / raw_e2e
    per_message_ratio = sdk["capacity"]["e2e_msg_s"] / raw_e2e
    for name, path in results.items():
        for phase, figures in path.items():
            for metric, value in figures.items():
                unit = "msg/s" if metric.endswith("msg_s") else "ms" if "_ms" in metric else ""
                section.figure(f"{phase}_{metric}", value, unit, system=name)
    section.figure("sdk_to_raw_e2e_ratio", ratio, "")
    section.figure("sdk_per_message_to_raw_e2e_ratio", per_message_ratio, "")
    section.table(
        "Capacity (closed loop, at most 10,000 messages unacknowledged)",
        [
            "path",
            "produce msg/s",
            "end-to-end msg/s",
            "publish p50 ms",
            "publish p99 ms",
            "cyclic GC % of time",
        ],
        [
            [
                name,
                round(path["capacity"]["produce_msg_s"]),
                round(path["capacity"]["e2e_msg_s"]),
                round(path["capacity"]["publish_p50_ms"], 1),
                round(path["capacity"]["publish_p99_ms"], 1),
                round(100 * path["capacity"]["gc_share"], 1),
            ]
            for name, path in results.items()
        ],
    )
    section.table(
        f"Latency at {sdk['latency']['offered_msg_s']:,.0f} msg/s offered "
        "(half the per-message SDK's capacity, every path), from the intended send time",
        ["path", "acked msg/s", "publish p50 ms", "publish p99 ms", "e2e p50 ms", "e2e p99 ms"],
        [
            [
                name,
                round(path["latency"]["produce_msg_s"]),
                round(path["latency"]["publish_p50_ms"], 2),
                round(path["latency"]["publish_p99_ms"], 2),
                round(path["latency"]["e2e_p50_ms"], 2),
                round(path["latency"]["e2e_p99_ms"], 2),
            ]
            for name, path in results.items()
        ],
    )
    section.target(
        "SDK end-to-end throughput (send_many / receive_many) / raw segment path",
        ratio >= TARGET_RATIO,
        f"{ratio:.2f} ({batch['capacity']['e2e_msg_s']:,.0f} / {raw_e2e:,.0f} msg/s)",
        f">= {TARGET_RATIO:.2f}",
    )
    section.note(
        f"Per message (send_async, receive, ack) the SDK reaches {per_message_ratio:.2f} of the "
        f"raw path ({sdk['capacity']['e2e_msg_s']:,.0f} msg/s): a future, a coroutine step and "
        "a callback per message, and the cyclic GC walking the unacknowledged ones "
        "(docs/client.md, 'Throughput')."
    )
    section.note(
        f"{SEGMENTS} segments on {BROKERS} broker processes (fsync=always), {PAYLOAD} B values, "
        f"random keys from {KEYS:,}, one topic per path. sdk: ScalableTopicProducer.send_async "
        f"per message -> {CONSUMERS} StreamConsumers (receive + ack per message); sdk-batch: "
        f"send_many of {BATCH} messages -> {CONSUMERS} StreamConsumers (receive_many + "
        f"ack_many); raw: hand-grouped entries of up to {BATCH} messages per segment and bucket "
        "(SegmentProducer.send_encoded) -> one SegmentConsumer per segment. Client side in one "
        "process (the objects of the in-process operator server and harness frozen out of the "
        f"cyclic GC, gc.freeze()); {mode.step:.0f} s measured per step after "
        f"{mode.warmup:.1f} s of warm-up."
    )
    errors = sum(p[s]["errors"] for p in results.values() for s in p)
    unreceived = sum(p[s]["unreceived"] for p in results.values() for s in p)
    section.note(
        f"{errors:.0f} send errors; {unreceived:.0f} acknowledged messages of the measured "
        f"windows not received within {mode.drain:.0f} s. On a shared machine the figures move "
        "with other work: compare the two paths within one report."
    )
    section.data.update(
        {
            "results": results,
            "ratio": ratio,
            "per_message_ratio": per_message_ratio,
            "mode": mode.__dict__,
        }
    )

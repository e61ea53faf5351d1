"""Key-shared stream consumption beyond the segment count (PIP-486 use case 3, issue 14).

A topic at ``maxSegments`` (64 segments of 4 entry buckets: 256 buckets) on two real broker
processes, the real operator session server (in-process) and one keyed open-loop producer.
First as many stream consumers as segments read it (one segment each), then 200: the controller
spreads the segments' buckets so that every consumer reads, handing each moving bucket over only
once its previous owner acknowledged what it took. Measured:

* the **share** of each consumer over a steady window (messages it received): min/median/max,
  and the aggregate consume throughput next to the segment-count phase;
* **join to first message**: from a consumer's ``start()`` to its first message (target <= 2 s);
* the **hand-off pause** of a moving bucket: its first delivery to the new owner minus its last
  delivery to the previous one; next to it what it is made of: the bucket's steady gap between
  deliveries (``bucket_gap``) and the hand-off's own cost, the send-to-delivery wait of the new
  owner's first message (``handoff_wait``), against every message's latency per phase.

Every payload carries its send time, so the breakdowns come from the deliveries alone.

    python -m bench.run --only keyshared [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._stats import percentile
from bench.report import Report

TARGET_JOIN_P99_S = 2.0
NS, TOPIC, SUB = "bench", "keyshared", "s"


@dataclass(frozen=True)
class Mode:
    segments: int
    buckets: int
    consumers: int
    rate: float
    keys: int
    window: float


FULL = Mode(segments=64, buckets=4, consumers=200, rate=1000.0, keys=4096, window=10.0)
QUICK = Mode(segments=8, buckets=4, consumers=24, rate=400.0, keys=512, window=4.0)


@dataclass
class Deliveries:
    """Every delivery: time, consumer, (segment, bucket), and when the producer sent it."""

    items: list[tuple[float, str, int, int]] = field(default_factory=list)
    sent: list[float] = field(default_factory=list)
    """Per item: the producer's ``send_async`` time (the payload carries it)."""
    per_consumer: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    first: dict[str, float] = field(default_factory=dict)
    first_sent: dict[str, float] = field(default_factory=dict)


def payload(sent_at: float) -> bytes:
    """100 bytes that carry their send time (``time.monotonic``, one clock in one process)."""
    return (b"%.6f|" % sent_at).ljust(100, b"x")


def sent_at(value: bytes) -> float:
    return float(value.partition(b"|")[0])


@dataclass
class Pauses:
    pauses: list[float] = field(default_factory=list)
    """Per change of a (segment, bucket)'s consumer: the new owner's first delivery of it minus
    the previous owner's last."""
    excess: list[float] = field(default_factory=list)
    """Each pause minus its bucket's median gap between deliveries."""
    gaps: list[float] = field(default_factory=list)
    """Every gap between two deliveries of a bucket to the same consumer (no hand-off): what a
    pause is made of when the bucket simply had nothing to deliver."""


def handoff_pauses(items: list[tuple[float, str, int, int]]) -> Pauses:
    """Per (segment, bucket), in delivery order: the pauses at each change of consumer, their
    excess over the bucket's median gap, and the steady gaps."""
    by_unit: dict[tuple[int, int], list[tuple[float, str]]] = defaultdict(list)
    for at, consumer, segment, bucket in items:
        by_unit[(segment, bucket)].append((at, consumer))
    out = Pauses()
    for deliveries in by_unit.values():
        deliveries.sort()
        pairs = list(itertools.pairwise(deliveries))
        gaps = [t1 - t0 for (t0, c0), (t1, c1) in pairs if c0 == c1]
        out.gaps.extend(gaps)
        usual = statistics.median(gaps) if gaps else 0.0
        for (t0, c0), (t1, c1) in pairs:
            if c0 != c1:
                out.pauses.append(t1 - t0)
                out.excess.append(max(0.0, t1 - t0 - usual))
    return out


def handoff_waits(items: list[tuple[float, str, int, int]], sent: list[float]) -> list[float]:
    """Per change of a (segment, bucket)'s consumer: how long the new owner's first message
    of it had waited since it was sent (its end-to-end latency). Unlike the pause, this leaves
    out the time the bucket simply had nothing to deliver: it is what the hand-off (withhold,
    release, attach, redelivery) cost the messages caught in it."""
    last: dict[tuple[int, int], str] = {}
    waits: list[float] = []
    for (at, consumer, segment, bucket), when in sorted(zip(items, sent, strict=True)):
        unit = (segment, bucket)
        previous = last.get(unit)
        if previous is not None and previous != consumer:
            waits.append(at - when)
        last[unit] = consumer
    return waits


async def _measure(mode: Mode, base: Path) -> dict[str, Any]:
    from scalable_topics.client import ConsumerClosedError, ScalableTopicProducer, StreamConsumer
    from scalable_topics.core.buckets import bucket_of
    from scalable_topics.core.hashing import bucket_hash
    from tests.integration.client_harness import TopicEnv, broker_processes, start_operator

    with broker_processes(base, 2) as brokers:
        operator = await start_operator()
        env = TopicEnv(
            operator,
            [b.url for b in brokers],
            NS,
            TOPIC,
            subscriptions={SUB: "Stream"},
            bucket_budget=mode.segments * mode.buckets,
        )
        consumers: dict[str, StreamConsumer] = {}
        tasks: list[asyncio.Task[None]] = []
        got = Deliveries()
        stop = asyncio.Event()
        errors: list[BaseException] = []
        try:
            await env.create(mode.segments)
            keys = [f"key-{i}" for i in range(mode.keys)]
            bucket_by_key = {k: bucket_of(bucket_hash(k), mode.buckets) for k in keys}

            async def consume(consumer: StreamConsumer) -> None:
                name = consumer.name
                try:
                    while True:
                        message = await consumer.receive()
                        now = time.monotonic()
                        produced = sent_at(message.value)
                        if name not in got.first:
                            got.first[name] = now
                            got.first_sent[name] = produced
                            if len(got.first) >= expected:
                                all_reading.set()
                        got.per_consumer[name] += 1
                        key = message.key or ""
                        got.items.append((now, name, message.segment_id, bucket_by_key[key]))
                        got.sent.append(produced)
                        consumer.ack_nowait(message)
                except ConsumerClosedError:
                    return
                except Exception as exc:
                    errors.append(exc)

            joined: dict[str, float] = {}
            registered: dict[str, float] = {}
            all_reading = asyncio.Event()
            expected = mode.consumers

            async def join(name: str) -> None:
                consumer = StreamConsumer(env.service_url, NS, TOPIC, SUB, name, permits=64)
                consumers[name] = consumer
                joined[name] = time.monotonic()
                await consumer.start(within=120.0)
                registered[name] = time.monotonic()
                tasks.append(asyncio.create_task(consume(consumer)))

            spans: dict[str, tuple[float, float]] = {}

            async def window(names: list[str], span: str) -> tuple[dict[str, int], float]:
                before = {n: got.per_consumer[n] for n in names}
                started = time.monotonic()
                await asyncio.sleep(mode.window)
                elapsed = time.monotonic() - started
                spans[span] = (started, started + elapsed)
                return {n: got.per_consumer[n] - before[n] for n in names}, elapsed

            async with ScalableTopicProducer(env.service_url, NS, TOPIC, linger_ms=2) as producer:

                async def send() -> None:
                    started = time.monotonic()
                    sent = 0
                    while not stop.is_set():
                        due = int((time.monotonic() - started) * mode.rate)
                        while sent < due:
                            await producer.send_async(
                                payload(time.monotonic()), key=keys[sent % len(keys)]
                            )
                            sent += 1
                        await asyncio.sleep(0.002)

                sender = asyncio.create_task(send())
                first = [f"c{i:03d}" for i in range(mode.segments)]
                await asyncio.gather(*(join(n) for n in first))
                await asyncio.sleep(mode.window / 2)
                shares_segments, elapsed_segments = await window(first, "segments")

                later = [f"c{i:03d}" for i in range(mode.segments, mode.consumers)]
                joining = time.monotonic()
                for name in later:
                    await join(name)
                everyone = first + later
                expected = len(everyone)
                if len(got.first) < expected:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(all_reading.wait(), 60.0)
                spans["joining"] = (joining, time.monotonic())
                await asyncio.sleep(mode.window / 2)
                shares_all, elapsed_all = await window(everyone, "all")
                stop.set()
                await sender
            coordinator = operator.hub.coordinator(NS, TOPIC, SUB)
            readers = len(set(coordinator.unit_owners().values())) if coordinator else 0  # type: ignore[attr-defined]
            join_times = [got.first[n] - joined[n] for n in later if n in got.first]
            reading = [n for n in later if n in got.first]
            never = [n for n in later if n not in got.first]
            return {
                "segments_phase": shares_segments,
                "segments_elapsed": elapsed_segments,
                "all_phase": shares_all,
                "all_elapsed": elapsed_all,
                "join_s": join_times,
                "never": never,
                "register_s": [registered[n] - joined[n] for n in reading],
                "nothing_sent_s": [max(0.0, got.first_sent[n] - joined[n]) for n in reading],
                "join_held_s": [got.first[n] - max(joined[n], got.first_sent[n]) for n in reading],
                "handoff_waits_s": handoff_waits(got.items, got.sent),
                "latency_s": {
                    span: [
                        at - sent
                        for (at, *_), sent in zip(got.items, got.sent, strict=True)
                        if t0 <= at < t1
                    ]
                    for span, (t0, t1) in spans.items()
                },
                "pauses": handoff_pauses(got.items),
                "readers": readers,
                "errors": len(errors),
                "releases": sum(c.releases for c in consumers.values()),
            }
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.gather(*(c.close() for c in consumers.values()), return_exceptions=True)
            await env.close()
            await operator.stop()


async def run(report: Report, quick: bool) -> None:
    mode = QUICK if quick else FULL
    section = report.section(
        "keyshared", "Key-shared stream consumers beyond the segment count (PIP-486)"
    )
    with tempfile.TemporaryDirectory(prefix="bench-keyshared-") as tmp:
        result = await _measure(mode, Path(tmp))
    shares = sorted(result["all_phase"].values())
    rate_all = sum(shares) / result["all_elapsed"]
    rate_segments = sum(result["segments_phase"].values()) / result["segments_elapsed"]
    joins = result["join_s"]
    measured: Pauses = result["pauses"]
    pauses = measured.pauses
    section.figure("share_min", shares[0], "msg", consumers=str(mode.consumers))
    section.figure("share_median", statistics.median(shares), "msg", consumers=str(mode.consumers))
    section.figure("share_max", shares[-1], "msg", consumers=str(mode.consumers))
    section.figure("consume_rate", rate_all, "msg/s", consumers=str(mode.consumers))
    section.figure("consume_rate", rate_segments, "msg/s", consumers=str(mode.segments))
    if joins:
        section.figure("join_to_first_p50", percentile(joins, 0.5), "s")
        section.figure("join_to_first_p99", percentile(joins, 0.99), "s")
        section.figure("join_to_first_max", max(joins), "s")
        for name, values in (
            ("join_to_assigned", result["register_s"]),
            ("join_nothing_sent", result["nothing_sent_s"]),
            ("join_first_held", result["join_held_s"]),
        ):
            section.figure(f"{name}_p50", percentile(values, 0.5), "s")
            section.figure(f"{name}_p99", percentile(values, 0.99), "s")
    waits = result["handoff_waits_s"]
    if waits:
        section.figure("handoff_wait_p50", 1000.0 * percentile(waits, 0.5), "ms")
        section.figure("handoff_wait_p99", 1000.0 * percentile(waits, 0.99), "ms")
    for span, latency in result["latency_s"].items():
        if latency:
            section.figure("latency_p50", 1000.0 * percentile(latency, 0.5), "ms", phase=span)
            section.figure("latency_p99", 1000.0 * percentile(latency, 0.99), "ms", phase=span)
    if pauses:
        section.figure("handoff_pause_p50", 1000.0 * percentile(pauses, 0.5), "ms")
        section.figure("handoff_pause_p99", 1000.0 * percentile(pauses, 0.99), "ms")
        excess = measured.excess
        section.figure("handoff_excess_p50", 1000.0 * percentile(excess, 0.5), "ms")
        section.figure("handoff_excess_p99", 1000.0 * percentile(excess, 0.99), "ms")
    if measured.gaps:
        section.figure("bucket_gap_p50", 1000.0 * percentile(measured.gaps, 0.5), "ms")
        section.figure("bucket_gap_p99", 1000.0 * percentile(measured.gaps, 0.99), "ms")
    section.target(
        "every consumer receives messages",
        shares[0] > 0 and not result["never"],
        f"min share {shares[0]} msg, {len(result['never'])} never received",
        "> 0 for all",
    )
    join_p99 = percentile(joins, 0.99) if joins else float("inf")
    section.target(
        "join to first message p99",
        join_p99 <= TARGET_JOIN_P99_S,
        f"{join_p99:.2f} s",
        f"<= {TARGET_JOIN_P99_S:.0f} s",
    )
    section.note(
        f"{mode.segments} segments x {mode.buckets} buckets, {mode.consumers} stream consumers "
        f"(first {mode.segments}, then the rest joining one by one), {mode.rate:.0f} msg/s of "
        f"100 B over {mode.keys} keys, steady windows of {mode.window:.0f} s; 2 broker "
        f"processes (fsync=always) and every consumer in one process. Consumers reading at the "
        f"end: {result['readers']}; buckets handed over: {result['releases']}; "
        f"{result['errors']} consumer errors."
    )
    section.note(
        "hand-off pause = a moving bucket's first delivery to its new owner minus its last "
        "delivery to the previous one; excess = pause minus that bucket's median gap. At "
        f"{mode.rate:.0f} msg/s over {mode.segments * mode.buckets} buckets a bucket gets "
        f"{mode.rate / (mode.segments * mode.buckets):.1f} msg/s, so the pause is mostly the "
        "time the bucket had nothing to deliver: compare it with bucket_gap (two deliveries of "
        "a bucket to one consumer, no hand-off). handoff_wait = how long the new owner's first "
        "message of a moved bucket had waited since it was sent: what the hand-off (withhold "
        "until released, release, attach, redelivery) cost; compare it with latency (every "
        "message, send to delivery, per phase: segments = 64 consumers, joining, all)."
    )
    section.note(
        "join to first message = join_to_assigned (start(): DAG watch, controller session, "
        "first assignment) + the wait for a message of its buckets: join_nothing_sent (none "
        "was sent yet) and join_first_held (from the later of the join and the first "
        "message's send to its delivery)."
    )
    section.note(
        "consume rate at the segment count vs with every consumer: the producer's open-loop "
        "rate bounds both; the figure shows sharing costs no throughput, not a ceiling."
    )

"""The producer-blocked window of a split (client SDK, DESIGN §5).

Two real broker processes, the real operator session server (in-process, fed from in-memory
layouts) and one :class:`~scalable_topics.client.ScalableTopicProducer` sending keyed messages
at a constant rate (open loop). While it sends, segments are split one after another through
the brokers' admin API in the protocol's order (children created fenced, parent terminated with
its successors, children activated, then the DAG push). The producer learns the successors from
the ``SEALED`` frame and re-routes at once.

For each key of a split segment, the **window** is the time between the key's last
acknowledgement on the parent and its first acknowledgement on a child. At a constant rate a
key's acknowledgements are spaced by its send interval even without a split, so the report also
gives the **excess** (window minus that interval): the time the split really cost the key.

    python -m bench.run --only split [--quick]
"""

from __future__ import annotations

import asyncio
import functools
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.report import Report

TARGET_P99_MS = 50.0


@dataclass(frozen=True)
class Mode:
    rate: float
    keys: int
    splits: int
    settle: float


QUICK = Mode(rate=2000.0, keys=16, splits=4, settle=0.6)
FULL = Mode(rate=4000.0, keys=32, splits=8, settle=1.0)


@dataclass
class SplitSample:
    parent: int
    children: list[int]
    windows_ms: list[float] = field(default_factory=list)
    excess_ms: list[float] = field(default_factory=list)
    rerouted: int = 0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def _measure(mode: Mode, base: Path) -> tuple[list[SplitSample], dict[str, Any]]:
    from scalable_topics.client import ScalableTopicProducer
    from scalable_topics.core.hashing import segment_hash
    from tests.integration.client_harness import TopicEnv, broker_processes, start_operator

    with broker_processes(base, 2) as brokers:
        operator = await start_operator()
        env = TopicEnv(
            operator, [b.url for b in brokers], "bench", "split", subscriptions={"s": "Stream"}
        )
        try:
            await env.create(2)
            keys = [f"key-{i}" for i in range(mode.keys)]
            acks: dict[str, list[tuple[float, int]]] = defaultdict(list)
            latencies: list[float] = []
            errors: list[BaseException] = []
            stop = asyncio.Event()
            async with ScalableTopicProducer(
                env.service_url, "bench", "split", linger_ms=1
            ) as producer:

                def record(key: str, sent: float, future: asyncio.Future[Any]) -> None:
                    if future.cancelled():
                        return
                    if future.exception() is not None:
                        errors.append(future.exception())  # type: ignore[arg-type]
                        return
                    now = time.monotonic()
                    acks[key].append((now, future.result().segment_id))
                    latencies.append(now - sent)

                async def send() -> None:
                    started = time.monotonic()
                    sent = 0
                    while not stop.is_set():
                        due = int((time.monotonic() - started) * mode.rate)
                        while sent < due:
                            key = keys[sent % len(keys)]
                            future = await producer.send_async(b"x" * 100, key=key)
                            future.add_done_callback(
                                functools.partial(record, key, time.monotonic())
                            )
                            sent += 1
                        await asyncio.sleep(0.001)

                sender = asyncio.create_task(send())
                samples: list[SplitSample] = []
                await asyncio.sleep(mode.settle)
                for _ in range(mode.splits):
                    target = max(env.layout.active(), key=lambda s: s.hash_range.size)
                    before = producer.reroutes
                    children = await env.split(target.segment_id)
                    samples.append(SplitSample(target.segment_id, children))
                    await asyncio.sleep(mode.settle)
                    samples[-1].rerouted = producer.reroutes - before
                stop.set()
                await sender
                await producer.flush()
            interval_ms = 1000.0 * mode.keys / mode.rate
            for sample in samples:
                parent_range = env.layout.segments[sample.parent].hash_range
                for key in keys:
                    if not parent_range.contains(segment_hash(key)):
                        continue
                    history = sorted(acks[key])
                    on_parent = [t for t, s in history if s == sample.parent]
                    on_child = [t for t, s in history if s in sample.children]
                    if not on_parent or not on_child:
                        continue
                    window = 1000.0 * (min(on_child) - max(on_parent))
                    sample.windows_ms.append(window)
                    sample.excess_ms.append(max(0.0, window - interval_ms))
            extra = {
                "errors": len(errors),
                "latency_p50_ms": 1000.0 * _pct(latencies, 0.5),
                "latency_p99_ms": 1000.0 * _pct(latencies, 0.99),
                "messages": len(latencies),
                "interval_ms": interval_ms,
            }
            return samples, extra
        finally:
            await env.close()
            await operator.stop()


async def run(report: Report, quick: bool) -> None:
    mode = QUICK if quick else FULL
    section = report.section("split", "Producer-blocked window of a split (client SDK)")
    with tempfile.TemporaryDirectory(prefix="bench-split-") as tmp:
        samples, extra = await _measure(mode, Path(tmp))
    windows = [w for s in samples for w in s.windows_ms]
    excess = [w for s in samples for w in s.excess_ms]
    if not windows:
        raise RuntimeError("no key was observed on both a parent and a child")
    p50, p99, worst = _pct(windows, 0.5), _pct(windows, 0.99), max(windows)
    section.figure("window_p50", p50, "ms")
    section.figure("window_p99", p99, "ms")
    section.figure("window_max", worst, "ms")
    section.figure("excess_p50", _pct(excess, 0.5), "ms")
    section.figure("excess_p99", _pct(excess, 0.99), "ms")
    section.figure("publish_latency_p50", extra["latency_p50_ms"], "ms")
    section.figure("publish_latency_p99", extra["latency_p99_ms"], "ms")
    section.table(
        "Splits",
        ["parent", "children", "keys", "re-routes", "window p50 ms", "window max ms"],
        [
            [
                s.parent,
                ",".join(map(str, s.children)),
                len(s.windows_ms),
                s.rerouted,
                round(statistics.median(s.windows_ms), 2) if s.windows_ms else None,
                round(max(s.windows_ms), 2) if s.windows_ms else None,
            ]
            for s in samples
        ],
    )
    section.target(
        "split window p99",
        p99 <= TARGET_P99_MS,
        f"{p99:.1f} ms",
        f"<= {TARGET_P99_MS:.0f} ms",
    )
    section.note(
        f"{mode.rate:.0f} msg/s of 100 B over {mode.keys} keys (one message per key every "
        f"{extra['interval_ms']:.1f} ms), {mode.splits} splits, 2 broker processes "
        "(fsync=always), {n} samples; {e} send errors.".format(n=len(windows), e=extra["errors"])
    )
    section.note(
        "window = a key's first ack on a child minus its last ack on the parent; excess = "
        "window minus the key's send interval (what the split itself cost)."
    )
    section.note(
        f"For scale: the steady publish->ack latency of the same run is p50 "
        f"{extra['latency_p50_ms']:.1f} ms, p99 {extra['latency_p99_ms']:.1f} ms; a window "
        "holds one seal (broker fsync of the termination marker), the SEALED frame, one "
        "connection handshake to each child broker (held until the child is activated: one "
        "directory fsync on its broker, after the seal) and one child ack."
    )
    section.data.update(
        {
            "windows_ms": windows,
            "mode": mode.__dict__,
            **{k: v for k, v in extra.items() if k != "interval_ms"},
        }
    )

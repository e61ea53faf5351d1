"""Quick produce (and optionally consume) measurement against a real broker subprocess.

Not a test and not the project benchmark (that is ``python -m bench.run``): a developer's
sanity check of the broker's hot path. The broker runs pinned to CPU 0, this client on CPU 1
(when there are two).

    python -m bench.quick_broker --payload 100 --batch 500 --seconds 10
    python -m bench.quick_broker --payload 1000 --rate 50000   # open loop

Closed loop (default): as fast as the in-flight window allows. Open loop (``--rate``): messages
are due at ``start + i/rate``; every millisecond the due messages are sent in entries of at most
``--batch`` messages; an entry's latency is measured from the due time of its *first* message
to its ack (coordinated-omission free, conservative for the rest of the entry). Batches are
encoded at once and sent with ``SegmentProducer.send_encoded``; the SDK's own path
(``ScalableTopicProducer``) is measured by ``python -m bench.run --only sdk``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from scalable_topics.client.segment import EntryAck, SegmentAdmin, SegmentConsumer, SegmentProducer
from scalable_topics.core import wire
from segment_broker.tools.launch import broker_command


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _wait_ready(url: str, deadline: float) -> None:
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url + "/readyz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.05)
    raise TimeoutError("broker did not become ready")


class Percentiles:
    """Latency samples weighted by message count (kept small: one sample per entry)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []
        self.timeline: list[tuple[float, float]] = []

    def worst_windows(self, start: float, width: float = 0.25, n: int = 5) -> str:
        """The ``n`` time windows with the highest latency (where the tail comes from)."""
        worst: dict[int, float] = {}
        for at, v in self.timeline:
            w = int((at - start) / width)
            worst[w] = max(worst.get(w, 0.0), v)
        top = sorted(worst.items(), key=lambda kv: -kv[1])[:n]
        return ", ".join(f"t={w * width:.2f}s:{v * 1000:.0f}ms" for w, v in sorted(top))

    def add(self, value: float, count: int, at: float = 0.0) -> None:
        self.samples.append((value, count))
        self.timeline.append((at, value))

    def pct(self, p: float) -> float:
        if not self.samples:
            return float("nan")
        ordered = sorted(self.samples)
        total = sum(c for _, c in ordered)
        target = p / 100.0 * total
        acc = 0
        for v, c in ordered:
            acc += c
            if acc >= target:
                return v
        return ordered[-1][0]


async def run(args: argparse.Namespace) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    scratch = None if args.data_dir else tempfile.TemporaryDirectory(prefix="quick-bench-")
    data_dir = Path(args.data_dir or scratch.name)  # type: ignore[union-attr]
    cmd = broker_command(port, data_dir, "--fsync", args.fsync, "--log-level", "WARNING")
    ncpu = os.cpu_count() or 1
    if ncpu >= 2 and args.pin:
        cmd = ["taskset", "-c", "0", *cmd]
        os.sched_setaffinity(0, {1})
    broker = subprocess.Popen(cmd)  # noqa: ASYNC220 - started once, before measuring
    try:
        await _wait_ready(url, time.monotonic() + 30)
        async with SegmentAdmin(url) as admin:
            subs = {"bench": "Exclusive"} if args.consume else {}
            await admin.create_segment("bench", "quick", 0, 0, 0xFFFF, subscriptions=subs)
        cpu0 = _cpu_seconds(broker.pid), time.process_time(), time.perf_counter()
        await _produce(url, args)
        wall = time.perf_counter() - cpu0[2]
        print(
            f"cpu: broker {(_cpu_seconds(broker.pid) - cpu0[0]) / wall:.0%} of a core, "
            f"client {(time.process_time() - cpu0[1]) / wall:.0%}, "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        if args.verbose:
            await _print_fsyncs(url)
    finally:
        broker.terminate()
        broker.wait(30)
        if scratch is not None:
            scratch.cleanup()


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (taskset execs the broker, so the pid is the broker's)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _print_fsyncs(url: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as resp:
        text = await resp.text()
    for fam in text_string_to_metric_families(text):
        if fam.name == "segment_broker_fsync_seconds":
            values = {s.name: s.value for s in fam.samples if not s.labels}
            buckets = [(s.labels["le"], s.value) for s in fam.samples if "le" in s.labels]
            count = values.get("segment_broker_fsync_seconds_count", 0)
            total = values.get("segment_broker_fsync_seconds_sum", 0)
            print(f"broker: {count:.0f} group commits, mean {total / max(count, 1) * 1000:.2f} ms")
            print("  cumulative:", ", ".join(f"<={le}s:{v:.0f}" for le, v in buckets))


async def _produce(url: str, args: argparse.Namespace) -> None:
    producer = await SegmentProducer.connect(
        url, "bench", "quick", 0, "quick-bench", max_inflight_bytes=args.window
    )
    keys = [f"key-{i}".encode() for i in range(args.keys)]
    value = os.urandom(args.payload)
    values = [value] * args.batch
    lat = Percentiles()
    loop = asyncio.get_running_loop()
    consumed = 0
    consumer_task = None
    if args.consume:
        consumer = await SegmentConsumer.connect(
            url, "bench", "quick", 0, "bench", "c", permits=2000
        )

        async def consume() -> None:
            nonlocal consumed
            while True:
                await consumer.wait_ready()
                items = consumer.receive_nowait(1000)
                if not items:
                    if consumer.failure is not None or consumer.end_of_segment:
                        return
                    continue
                for it in items:
                    consumed += wire.decode_entry_header(it.entry).message_count
                consumer.ack_cumulative(items[-1].position)

        consumer_task = loop.create_task(consume())

    sent = 0
    k = 0
    nkeys = len(keys)
    start = time.perf_counter()
    end = start + args.warmup + args.seconds
    measure_from = start + args.warmup

    def on_ack(due: float, count: int) -> Callable[[asyncio.Future[EntryAck]], None]:
        def cb(fut: asyncio.Future[EntryAck]) -> None:
            if not fut.cancelled() and fut.exception() is None and due >= measure_from:
                lat.add(time.perf_counter() - due, count, due)

        return cb

    async def send_batch(n: int, due: float) -> None:
        nonlocal k, sent
        ks = [keys[(k + i) % nkeys] for i in range(n)]
        k = (k + n) % nkeys
        payload, count, hmin, hmax, sample, keyed = wire.encode_keyed_values(ks, values[:n])
        fut = await producer.send_encoded(payload, count, hmin, hmax, sample, keyed)
        fut.add_done_callback(on_ack(due, n))
        sent += n

    if args.rate:
        interval = 0.001
        next_tick = start
        while True:
            now = time.perf_counter()
            if now >= end:
                break
            due_total = int((now - start) * args.rate)
            while sent < due_total:
                n = min(args.batch, due_total - sent)
                await send_batch(n, start + sent / args.rate)
            next_tick += interval
            delay = next_tick - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
    else:
        while time.perf_counter() < end:
            await send_batch(args.batch, time.perf_counter())
    await producer.flush()
    elapsed = time.perf_counter() - start
    await producer.close()
    if consumer_task is not None:
        deadline = time.monotonic() + 30
        while consumed < sent and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        consumer_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer_task
    mode = f"open loop {args.rate}/s" if args.rate else "closed loop"
    print(
        f"{mode}: payload {args.payload} B, batch {args.batch}, fsync={args.fsync}: "
        f"{sent} msgs in {elapsed:.2f} s = {sent / elapsed:,.0f} msg/s "
        f"({sent * args.payload / elapsed / 1e6:.1f} MB/s payload); "
        f"ack latency p50 {lat.pct(50) * 1000:.2f} ms, p99 {lat.pct(99) * 1000:.2f} ms, "
        f"max {lat.pct(100) * 1000:.2f} ms" + (f"; consumed {consumed}" if args.consume else "")
    )
    if args.verbose:
        print("worst windows:", lat.worst_windows(start))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=0.0, help="seconds not measured")
    parser.add_argument("--rate", type=int, default=0, help="open-loop msg/s (0: closed loop)")
    parser.add_argument("--window", type=int, default=4 << 20, help="in-flight bytes")
    parser.add_argument("--fsync", choices=["always", "interval"], default="always")
    parser.add_argument("--consume", action="store_true", help="also consume (same process)")
    parser.add_argument("--data-dir")
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="broker on CPU 0, client on CPU 1 (--no-pin: let the scheduler place them)",
    )
    parser.add_argument("--verbose", action="store_true", help="show where the tail comes from")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.run(run(args))
    except ImportError:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()

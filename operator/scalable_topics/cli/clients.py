"""``stopic produce|consume|bench``: the SDK from the command line.

All three talk to the operator's session URL (``--service-url``, e.g. the operator Service or,
with the embedded control plane, an operator pod's address) and to the brokers it names.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import sys
import time
from typing import Any

from ..client import (
    QueueConsumer,
    ScalableTopicProducer,
    StreamConsumer,
)


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]


async def cmd_produce(args: argparse.Namespace) -> int:
    """Send ``--count`` messages (or read lines from stdin with ``--stdin``)."""
    async with ScalableTopicProducer(
        args.service_url, args.namespace, args.topic, name=args.name
    ) as producer:
        if args.stdin:
            sent = 0
            for line in sys.stdin:
                key, _, value = line.rstrip("\n").partition(args.separator)
                if not value:
                    key, value = "", key
                message_id = await producer.send(value.encode(), key=key or None)
                sent += 1
                if args.verbose_ids:
                    print(f"{key}\t{message_id}")
            print(f"sent {sent} message(s)", file=sys.stderr)
            return 0
        keys = itertools.cycle([f"{args.key_prefix}{i}" for i in range(args.keys)])
        payload = b"x" * args.size
        started = time.monotonic()
        futures = []
        for i in range(args.count):
            if args.rate:
                target = started + i / args.rate
                delay = target - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            futures.append(await producer.send_async(payload, key=next(keys)))
        await asyncio.gather(*futures)
        elapsed = time.monotonic() - started
        print(
            f"sent {args.count} message(s) in {elapsed:.2f}s "
            f"({args.count / max(elapsed, 1e-9):,.0f} msg/s)"
        )
    return 0


async def cmd_consume(args: argparse.Namespace) -> int:
    """Print (or count) messages until ``--count`` or Ctrl-C."""
    consumer: Any
    if args.type == "queue":
        consumer = QueueConsumer(
            args.service_url, args.namespace, args.topic, args.subscription, args.name
        )
    else:
        consumer = StreamConsumer(
            args.service_url, args.namespace, args.topic, args.subscription, args.name
        )
    received = 0
    async with consumer:
        async for message in consumer:
            received += 1
            if not args.quiet:
                key = message.key.decode(errors="replace") if message.key else ""
                print(
                    f"{message.segment_id}:{message.position}\t{key}\t"
                    f"{message.value.decode(errors='replace')}",
                    flush=True,
                )
            await consumer.ack(message)
            if args.count and received >= args.count:
                break
    print(f"received {received} message(s)", file=sys.stderr)
    return 0


def _record_latency(latencies: list[float], intended: float) -> Any:
    def done(future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is None:
            latencies.append(time.monotonic() - intended)

    return done


async def cmd_bench(args: argparse.Namespace) -> int:
    """Open-loop produce at ``--rate`` for ``--duration``; latency from the intended send time."""
    latencies: list[float] = []
    payload = b"x" * args.size
    keys = [f"bench-{i}" for i in range(args.keys)]
    async with ScalableTopicProducer(
        args.service_url, args.namespace, args.topic, name=args.name
    ) as producer:
        start = time.monotonic()
        total = int(args.rate * args.duration)
        futures = []
        for i in range(total):
            intended = start + i / args.rate
            delay = intended - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            future = await producer.send_async(payload, key=keys[i % len(keys)])
            future.add_done_callback(_record_latency(latencies, intended))
            futures.append(future)
        results = await asyncio.gather(*futures, return_exceptions=True)
        elapsed = time.monotonic() - start
    failed = sum(1 for r in results if isinstance(r, BaseException))
    latencies.sort()
    print(
        f"{total - failed} acknowledged, {failed} failed in {elapsed:.1f}s: "
        f"{(total - failed) / elapsed:,.0f} msg/s of {args.size} B"
    )
    print(
        "latency from intended send time: "
        + ", ".join(
            f"p{int(q * 1000) / 10:g} {_percentile(latencies, q) * 1000:.1f} ms"
            for q in (0.5, 0.99, 0.999)
        )
        + f", max {latencies[-1] * 1000 if latencies else math.nan:.1f} ms"
    )
    return 1 if failed else 0


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    service = argparse.ArgumentParser(add_help=False, parents=[common])
    service.add_argument(
        "--service-url",
        required=True,
        help="the operator's session URL, e.g. http://scalable-topics-operator:8080",
    )

    produce = sub.add_parser("produce", parents=[service], help="send messages to a topic")
    produce.add_argument("topic")
    produce.add_argument("--name", default=None, help="producer name (idempotence identity)")
    produce.add_argument("--stdin", action="store_true", help="send 'key<TAB>value' lines")
    produce.add_argument("--separator", default="\t")
    produce.add_argument("--verbose-ids", action="store_true")
    produce.add_argument("--count", type=int, default=1000)
    produce.add_argument(
        "--rate", type=float, default=0.0, help="messages/s (0: as fast as possible)"
    )
    produce.add_argument("--keys", type=int, default=100)
    produce.add_argument("--key-prefix", default="key-")
    produce.add_argument("--size", type=int, default=100)
    produce.set_defaults(afunc=cmd_produce)

    consume = sub.add_parser("consume", parents=[service], help="read messages from a topic")
    consume.add_argument("topic")
    consume.add_argument("--subscription", required=True)
    consume.add_argument("--name", required=True, help="consumer name (its identity)")
    consume.add_argument("--type", choices=("stream", "queue"), default="stream")
    consume.add_argument("--count", type=int, default=0, help="stop after this many (0: never)")
    consume.add_argument("--quiet", action="store_true")
    consume.set_defaults(afunc=cmd_consume)

    bench = sub.add_parser("bench", parents=[service], help="open-loop produce benchmark")
    bench.add_argument("topic")
    bench.add_argument("--name", default=None)
    bench.add_argument("--rate", type=float, default=5000.0)
    bench.add_argument("--duration", type=float, default=10.0)
    bench.add_argument("--size", type=int, default=100)
    bench.add_argument("--keys", type=int, default=1000)
    bench.set_defaults(afunc=cmd_bench)


def run(args: argparse.Namespace) -> int:
    from .topics import run_async

    with contextlib.suppress(KeyboardInterrupt):
        return run_async(args)
    return 130

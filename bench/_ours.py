"""Our segment broker: the server process and the client adapter (scalable_topics.client.segment).

The producer uses the client's batch path: each batch of the load generator becomes one entry
(`wire.encode_keyed_values`: every key is hashed and every message framed, in Python, like the
peers' clients do per message) sent with `SegmentProducer.send_encoded` and acknowledged after
the broker's group-committed fdatasync. Keys rotate over 1024 distinct keys; the segment covers
the whole ring with one entry bucket.

The consumer decodes every message of every entry (`ReceivedEntry.messages()`), as an
application would, and acknowledges cumulatively once per received batch.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench._load import consume_batches
from bench._procs import Server, free_port, start_server
from segment_broker.tools.launch import broker_command

DURABILITY = "ack after fdatasync (`--fsync always`, group commit)"
NAMESPACE = "bench"
TOPIC = "t"
SUBSCRIPTION = "bench"
KEYS = [f"key-{i}".encode() for i in range(1024)]
_KEYS_TWICE = KEYS + KEYS


def _version() -> str:
    repo = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        ["git", "-C", str(repo), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    )
    return f"segment_broker (this tree, {r.stdout.strip() or 'no commit'})"


def start_ours(workdir: Path) -> tuple[Server, dict[str, Any], str]:
    port = free_port()
    data = workdir / "data"
    argv = broker_command(port, data, "--fsync", "always")

    def ready() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
            return int(r.status) == 200

    env = {k: v for k, v in os.environ.items() if not k.startswith("SEGMENT_BROKER_")}
    server = start_server("segment-broker", argv, workdir, port, ready, env=env)
    return server, {"url": f"http://127.0.0.1:{port}"}, _version()


class OursProducer:
    def __init__(self, producer: Any, payload: bytes) -> None:
        from scalable_topics.core import wire

        self.producer = producer
        self.payload = payload
        self.encode = wire.encode_keyed_values
        self.next_key = 0

    async def send(self, n: int) -> None:
        k = self.next_key
        keys = (
            _KEYS_TWICE[k : k + n] if n <= len(KEYS) else (KEYS * (n // len(KEYS) + 2))[k : k + n]
        )
        self.next_key = (k + n) % len(KEYS)
        payload, count, hmin, hmax, sample, keyed = self.encode(keys, [self.payload] * n)
        fut = await self.producer.send_encoded(payload, count, hmin, hmax, sample, keyed)
        await asyncio.shield(fut)  # the future belongs to the client: never cancel it

    async def close(self) -> None:
        await self.producer.close()


class OursConsumer:
    def __init__(self, consumer: Any, batch: int) -> None:
        self.consumer = consumer
        self.batch = batch

    async def consume(self, max_messages: int, duration: float) -> tuple[int, float]:
        """Receive, decode each entry as the SDK's consumers do, acknowledge."""
        from scalable_topics.client.consumers.common import entry_messages as decode

        c = self.consumer
        segment = c.segment_id

        async def take(_remaining: int) -> int | None:
            try:
                await asyncio.wait_for(c.wait_ready(), timeout=1.0)
            except TimeoutError:
                return None
            if c.failure is not None:
                raise c.failure
            entries = c.receive_nowait(self.batch)
            if not entries:
                return None if c.end_of_segment else 0
            n = sum(len(decode(segment, e)) for e in entries)
            c.ack_cumulative(entries[-1].position)
            return n

        return await consume_batches(max_messages, duration, take)

    async def close(self) -> None:
        await self.consumer.close()


class OursAdapter:
    def __init__(self, endpoint: dict[str, Any]) -> None:
        self.url = str(endpoint["url"])
        self.segment = int(endpoint.get("run", 0))
        admin = endpoint.get("adminTokenFile")
        self.admin_token = Path(admin).read_text().strip() if admin else None
        """The admin identity's token when the broker runs with --auth (bench/_auth.py)."""

    async def reset(self) -> None:
        from scalable_topics.client.segment import SegmentAdmin

        async with SegmentAdmin(self.url, token=self.admin_token) as admin:
            await admin.delete_segment(NAMESPACE, TOPIC, self.segment)
            await admin.create_segment(
                NAMESPACE,
                TOPIC,
                self.segment,
                0,
                0xFFFF,
                buckets=1,
                subscriptions={SUBSCRIPTION: "Exclusive"},
            )

    async def producer(self, payload_size: int, batch: int, window: int) -> OursProducer:
        from scalable_topics.client.segment import SegmentProducer

        producer = await SegmentProducer.connect(
            self.url,
            NAMESPACE,
            TOPIC,
            self.segment,
            f"bench-{os.getpid()}-{time.monotonic_ns()}",
        )
        return OursProducer(producer, os.urandom(payload_size))

    async def consumer(self, batch: int) -> OursConsumer:
        from scalable_topics.client.segment import SegmentConsumer

        consumer = await SegmentConsumer.connect(
            self.url, NAMESPACE, TOPIC, self.segment, SUBSCRIPTION, "c1", permits=batch
        )
        return OursConsumer(consumer, batch)


async def ours_adapter(endpoint: dict[str, Any]) -> OursAdapter:
    return OursAdapter(endpoint)


STAGE_METRIC = "segment_broker_produce_stage_seconds"
LAG_METRIC = "segment_broker_event_loop_lag_seconds"
GC_METRIC = "segment_broker_gc_pause_seconds"
STAGES = ("frame", "stage", "write", "sync", "visible", "ack")
"""The broker's produce stages (`segment_broker_produce_stage_seconds{stage}`), in path order."""


def fsync_stats(endpoint: dict[str, Any]) -> dict[str, float]:
    """Cumulative histograms of the broker: flushes (write + fdatasync,
    `segment_broker_fsync_seconds`) under keys `le=…`, `count`, `sum`, and the produce stages
    (`segment_broker_produce_stage_seconds{stage}`) under `<stage>:le=…`, `<stage>:count`,
    `<stage>:sum`."""
    with urllib.request.urlopen(f"{endpoint['url']}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("segment_broker_fsync_seconds"):
            prefix, name = "", line[len("segment_broker_fsync_seconds") :]
        elif line.startswith(STAGE_METRIC):
            name = line[len(STAGE_METRIC) :]
            prefix = name.split('stage="', 1)[1].split('"', 1)[0] + ":"
        elif line.startswith(LAG_METRIC):
            prefix, name = "lag:", line[len(LAG_METRIC) :]
        elif line.startswith(GC_METRIC):
            name = line[len(GC_METRIC) :]
            prefix = "gc" + name.split('generation="', 1)[1].split('"', 1)[0] + ":"
        else:
            continue
        name, _, value = name.rpartition(" ")
        if name.startswith("_bucket"):
            le = name.split('le="', 1)[1].split('"', 1)[0]
            out[f"{prefix}le={le}"] = float(value)
        elif name.startswith(("_count", "_sum")):
            out[prefix + name[1:].split("{", 1)[0]] = float(value)
    return out


def _histogram_delta(
    before: dict[str, float], after: dict[str, float], prefix: str
) -> tuple[float, float, float]:
    """(count, sum, ~p99 as the upper bound of its bucket) of one histogram between scrapes."""
    count = after.get(f"{prefix}count", 0.0) - before.get(f"{prefix}count", 0.0)
    total = after.get(f"{prefix}sum", 0.0) - before.get(f"{prefix}sum", 0.0)
    le_key = f"{prefix}le="
    buckets = sorted(
        (float(k[len(le_key) :]), after[k] - before.get(k, 0.0))
        for k in after
        if k.startswith(le_key)
    )
    p99 = float("nan")
    for le, n in buckets:
        if count and n >= 0.99 * count:
            p99 = le
            break
    return count, total, p99


def fsync_delta(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, float]:
    """Per-step figures: syncs/s, flush mean and ~p99 (bucket upper bound), busy share; per
    produce stage its mean and ~p99 (`<stage>MeanMs`, `<stage>P99LeMs`)."""
    count, total, p99 = _histogram_delta(before, after, "")
    out = {
        "fsyncPerSec": count / wall if wall else 0.0,
        "fsyncMeanMs": total / count * 1000 if count else 0.0,
        "fsyncP99LeMs": p99 * 1000,
        "fsyncBusy": total / wall if wall else 0.0,
    }
    for stage in (*STAGES, "lag"):
        n, stage_total, stage_p99 = _histogram_delta(before, after, f"{stage}:")
        if n:
            out[f"{stage}MeanMs"] = stage_total / n * 1000
            out[f"{stage}P99LeMs"] = stage_p99 * 1000
    for generation in range(3):
        n, total_s, _ = _histogram_delta(before, after, f"gc{generation}:")
        out[f"gc{generation}Count"] = n
        out[f"gc{generation}Ms"] = total_s * 1000
    return out

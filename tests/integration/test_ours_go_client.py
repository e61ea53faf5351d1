"""The benchmark's Go client of our protocol (bench/ours-go, segment-bench) against a real broker:
what it produces is acknowledged and is what the SDK would have written (keys, values, the
header's hash range and key sample), its open-loop step keeps the offered rate, its consumer
gets every message back, and a refused handshake is an error, not a zero."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from bench import _ours, _ours_go
from scalable_topics.client.segment import SegmentConsumer
from scalable_topics.core import wire

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not shutil.which("go"), reason="segment-bench is built with Go (`go`)"),
]

PAYLOAD = 100


async def _entries_read_without_ack(url: str, segment: int, count: int) -> list[bytes]:
    consumer = await SegmentConsumer.connect(
        url, _ours.NAMESPACE, _ours.TOPIC, segment, _ours.SUBSCRIPTION, "py-check", permits=count
    )
    try:
        entries: list[bytes] = []
        while len(entries) < count:
            await asyncio.wait_for(consumer.wait_ready(), 10)
            entries += [bytes(e.entry) for e in consumer.receive_nowait(count - len(entries))]
        return entries
    finally:
        await consumer.close()


def test_segment_bench_produces_what_the_sdk_would_and_reads_it_all_back(tmp_path: Path) -> None:
    server, endpoint, _ = _ours_go.start_ours_go(tmp_path)
    try:
        ep = {**endpoint, "run": PAYLOAD}
        _ours_go.reset(ep)

        closed = _ours_go.produce(ep, PAYLOAD, None, 1.0, 0.3, batch=64, window=512)
        assert closed.errors == 0 and closed.first_error is None and closed.unfinished == 0
        assert closed.acked == closed.sent > 0
        assert 0 < closed.p50_ms <= closed.p99_ms <= closed.max_ms
        assert closed.client_cpu > 0 and closed.achieved > 0

        rate = 20_000.0
        open_loop = _ours_go.produce(ep, PAYLOAD, rate, 1.5, 0.5, batch=64, window=512)
        assert open_loop.errors == 0 and open_loop.unfinished == 0
        # Everything due by the end is generated, also when the last tick fires late.
        assert open_loop.acked == open_loop.sent == int(rate * 1.5)
        # Only messages intended after the warm-up are recorded: a third of them.
        assert open_loop.recorded == pytest.approx(rate * 1.0, rel=0.02)
        # achieved x the 1 s window = the acks inside it. A stall at the warm-up's end moves
        # acks of warm-up messages into the window, so on a loaded machine only bounds hold.
        assert 0 < open_loop.achieved * 1.0 <= open_loop.acked
        assert open_loop.gen_lag_max_ms >= open_loop.gen_lag_p99_ms > 0

        # The entries decode with the SDK: keyed messages of the payload's size, in key order,
        # and the header's hash range and key sample are those the SDK's encoder computes.
        entries = asyncio.run(_entries_read_without_ack(str(ep["url"]), PAYLOAD, 3))
        for entry in entries:
            header, messages = wire.decode_entry(entry)
            keys = [m.key for m in messages]
            assert all(k is not None and k.startswith(b"key-") for k in keys)
            assert all(len(m.value) == PAYLOAD for m in messages)
            _, count, hmin, hmax, sample, keyed = wire.encode_keyed_values(
                [k for k in keys if k is not None], [m.value for m in messages]
            )
            assert (header.message_count, header.hashb_min, header.hashb_max) == (
                count,
                hmin,
                hmax,
            )
            assert header.key_hash_sample == sample and header.keyed == keyed
            assert header.producer_name.startswith("bench-go-")

        # The Python check did not acknowledge: the Go consumer gets everything, once.
        consumed = _ours_go.consume(ep, 30.0)
        assert consumed.received == closed.acked + open_loop.acked
        assert consumed.seconds > 0 and consumed.client_cpu > 0
    finally:
        server.stop()


def test_segment_bench_reports_a_refused_handshake(tmp_path: Path) -> None:
    server, endpoint, _ = _ours_go.start_ours_go(tmp_path)
    try:
        missing = {**endpoint, "run": 999}
        with pytest.raises(RuntimeError, match="SegmentNotFound"):
            _ours_go.produce(missing, PAYLOAD, None, 0.5, 0.1, batch=64, window=512)
        with pytest.raises(RuntimeError, match="SegmentNotFound"):
            _ours_go.consume(missing, 1.0)
    finally:
        server.stop()
